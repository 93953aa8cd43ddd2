"""The distributed comparison function (DCF) of Boyle, Chandran, Gilboa, Gupta, Ishai, Kumar and
Rathee, "Function Secret Sharing for Mixed-Mode and Fixed-Point Secure Computation", Eurocrypt 2021
(eprint 2020/1392), Fig. 1.

Key size lambda + bits*(lambda + 2 + out_bits*width) + out_bits*width bits, plus an 8-byte header.
Eval costs 1 + ceil(width/2) AES blocks per level (2 for width 1 and 2); gen 4x that for both
parties. The leaf correction word also carries beta on x == alpha, which gives x <= alpha without
touching alpha + 1 (that would wrap at alpha = 2^bits - 1); x > alpha and x >= alpha walk the tree
on the complemented input, and signed inputs on the input with its sign bit flipped.
"""
from __future__ import annotations

from .function import TreeFunction
from .params import KIND_DCF, TreeParams

_CMP_ALIASES = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge"}


class DCF(TreeFunction):
    """f(x) = beta if `x cmp alpha` else 0, over x in [0, 2^bits) (or [-2^(bits-1), 2^(bits-1)) with
    `signed=True`), with values in (Z_{2^out_bits})^width, or with `group="p61"` in F_p^width for the
    prime p = 2^61 - 1 (`fss.field`; out_bits is then 61: leave it out or pass 61). The prime field
    is what the servers' report check needs (docs/verification.md); its keys run on the portable
    backend, except in `eval_grid`, whose fused kernel does F_p arithmetic too.

    cmp: "lt" (x < alpha, the default and the paper's), "le", "gt", "ge", or "<", "<=", ">", ">=".
    version: the key format, for group "p61" only: 2 (the default; each element a rejection-sampled
    61-bit PRG word) or 1 (each a whole PRG block mod p: keys of earlier releases; `fss.prg`).
    Raises `ParameterError` for bits or out_bits outside 1..64, width outside 1..65535, an
    unknown cmp or group, group "p61" with out_bits other than 61, or another version.
    """

    def __init__(
        self, bits: int, out_bits: int | None = None, width: int = 1, *, cmp: str = "lt", signed: bool = False,
        group: str = "ring", version: int | None = None,
    ):
        self.params = TreeParams.make(KIND_DCF, bits, out_bits, width, _CMP_ALIASES.get(cmp, cmp) if isinstance(cmp, str) else cmp, signed, group, version)

    @property
    def cmp(self) -> str:
        return self.params.cmp
