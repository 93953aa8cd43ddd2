"""The distributed point function (DPF) of Boyle, Gilboa and Ishai (CCS 2016): the same tree walk as
the DCF without the per-level payload. Key size lambda + bits*(lambda + 2) + out_bits*width bits,
plus an 8-byte header; eval costs one AES block per level, `eval_full` about 2^(bits+1) blocks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import numpy as _numpy

from . import backend
from .errors import ParameterError
from .function import TreeFunction
from .keys import Key
from .params import KIND_DPF, TreeParams

if TYPE_CHECKING:
    import numpy as np
else:
    np = _numpy(__name__)  # numpy at first use (`fss._lazy`)

MAX_FULL_BITS = 24


class DPF(TreeFunction):
    """f(x) = beta if x == alpha else 0, over x in [0, 2^bits) (or the signed range with
    `signed=True`), with values in (Z_{2^out_bits})^width, or with `group="p61"` in F_p^width,
    p = 2^61 - 1 (out_bits 61). Raises `ParameterError` for bits or out_bits outside 1..64, width
    outside 1..65535, an unknown group, or group "p61" with out_bits other than 61; `version` as
    for `DCF`."""

    def __init__(self, bits: int, out_bits: int | None = None, width: int = 1, *, signed: bool = False, group: str = "ring",
                 version: int | None = None):
        self.params = TreeParams.make(KIND_DPF, bits, out_bits, width, "eq", signed, group, version)

    def eval_full(self, key: Key) -> np.ndarray:
        """This party's shares at every x of the domain, indexed by x mod 2^bits (so for signed
        inputs, negative x sit at the top): uint64 array (2^bits,) or (2^bits, width). Costs
        2^bits * width * 8 bytes, so bits is limited to 24 (ParameterError above that)."""
        batch = self._check_keys(key, Key)
        if self.bits > MAX_FULL_BITS:
            raise ParameterError(f"eval_full is limited to bits <= {MAX_FULL_BITS}, got {self.bits}")
        internal = backend.eval_full(batch)
        order = np.arange(1 << self.bits, dtype=np.uint64) ^ np.uint64(self.params.input_xor)
        return self._shape(internal[:, order])
