"""Parameters of a tree function (DCF or DPF): validation, derived sizes and the key header.

One `TreeParams` value describes everything a key depends on. The public classes validate their
arguments once into a `TreeParams`; everything below trusts it.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Literal, overload

from .errors import ParameterError

FORMAT_VERSION = 1  # ring keys, and F_p keys with an element a whole PRG block (the first prime format)
PACKED_VERSION = 2  # F_p keys with an element a 61-bit PRG word, rejection-sampled (`fss.prg`): the default
VERSIONS = {"ring": (FORMAT_VERSION,), "p61": (FORMAT_VERSION, PACKED_VERSION)}
KIND_DCF = 1
KIND_DPF = 2
BATCH_FLAG = 0x80
HEADER_LEN = 8  # version, kind, party, bits, out_bits, flags, width (u16 LE)
BATCH_HEADER_LEN = HEADER_LEN + 8  # + number of keys (u64 LE)

# Comparison codes stored in the low 3 bits of the header's flags byte; bit 3 is "signed".
CMP_CODES = {"lt": 0, "le": 1, "gt": 2, "ge": 3, "eq": 4}
CMP_NAMES = {v: k for k, v in CMP_CODES.items()}
SIGNED_FLAG = 0x08
PRIME_FLAG = 0x10  # payloads in F_p, p = 2^61 - 1 (`fss.field`), out_bits = 61; else Z_{2^out_bits}
GROUPS = ("ring", "p61")
PRIME_BITS = 61
PRIME = (1 << PRIME_BITS) - 1
MAX_WIDTH = 0xFFFF
LAMBDA_BYTES = 16
GROUP = 16  # keys per group: the layout's unit, and the fused kernels' (one group's state in vector registers)


def check_int(name: str, value: object, lo: int, hi: int) -> int:
    """`value` as a Python int in [lo, hi]; bools, floats and strings are refused."""
    if isinstance(value, bool):
        raise ParameterError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)  # type: ignore[arg-type]  # any object: its TypeError is the answer
    except TypeError:
        raise ParameterError(f"{name} must be an int, got {type(value).__name__}") from None
    if not lo <= value <= hi:
        raise ParameterError(f"{name} must lie in [{lo}, {hi}], got {value}")
    return value


@overload
def check_party(party: object, optional: Literal[False] = False) -> int: ...
@overload
def check_party(party: object, optional: bool) -> int | None: ...


def check_party(party: object, optional: bool = False) -> int | None:
    """`party` as 0 or 1 (or None, where `optional`); anything else (2, 1.0, True, "0") raises ParameterError."""
    if party is None and optional:
        return None
    if not isinstance(party, bool):
        try:
            value = operator.index(party)  # type: ignore[arg-type]  # any object: its TypeError is the answer
        except TypeError:
            value = None
        if value in (0, 1):
            return value
    raise ParameterError(f"party must be 0 or 1{' or None' if optional else ''}, got {party!r}")


@dataclass(frozen=True)
class TreeParams:
    """Everything a key depends on. `cmp` is one of lt, le, gt, ge (DCF) or eq (DPF). `prime`:
    payloads in F_p with p = 2^61 - 1 (out_bits is then 61) instead of Z_{2^out_bits}. `version`: the
    key format (the header's first byte); it matters only over F_p, where version 1 takes each element
    from a whole PRG block and version 2 (the default) from a 64-bit word (`fss.prg`, "Prime-field
    payloads"), so that a width-2 key's grid walk costs 4 blocks a node and none at the leaves
    instead of 6 and 2."""

    kind: int
    bits: int
    out_bits: int
    width: int
    cmp: str
    signed: bool
    prime: bool = False
    version: int = FORMAT_VERSION

    @classmethod
    def make(
        cls, kind: int, bits: object, out_bits: object, width: object, cmp: str, signed: object, group: str = "ring",
        version: object = None,
    ) -> "TreeParams":
        if group not in GROUPS:
            raise ParameterError(f"group must be one of {GROUPS}, got {group!r}")
        if version is None:
            version = VERSIONS[group][-1]
        if not isinstance(version, int) or isinstance(version, bool) or version not in VERSIONS[group]:
            raise ParameterError(f"a group={group!r} function has key format version {' or '.join(map(str, VERSIONS[group]))}, "
                                 f"got {version!r}")
        bits = check_int("bits", bits, 1, 64)
        if group == "p61":
            if out_bits is None:
                out_bits = PRIME_BITS
            if isinstance(out_bits, bool) or out_bits != PRIME_BITS:
                raise ParameterError(f"a group='p61' function has out_bits = {PRIME_BITS}, got {out_bits!r}")
        elif out_bits is None:
            out_bits = 64
        out_bits = check_int("out_bits", out_bits, 1, 64)
        width = check_int("width", width, 1, MAX_WIDTH)
        if not isinstance(signed, bool):
            raise ParameterError(f"signed must be a bool, got {type(signed).__name__}")
        allowed = ("lt", "le", "gt", "ge") if kind == KIND_DCF else ("eq",)
        if not isinstance(cmp, str) or cmp not in allowed:
            raise ParameterError(f"cmp must be one of {allowed}, got {cmp!r}")
        return cls(kind, bits, out_bits, width, cmp, signed, group == "p61", int(version))

    # --- derived quantities -------------------------------------------------------------
    @property
    def level_payload(self) -> bool:
        """DCF keys carry a payload correction word per level; DPF keys only at the leaf."""
        return self.kind == KIND_DCF

    @property
    def group(self) -> str:
        return "p61" if self.prime else "ring"

    @property
    def modulus(self) -> int:
        """The payload group's order: 2^out_bits, or the prime p = 2^61 - 1."""
        return PRIME if self.prime else 1 << self.out_bits

    @property
    def block_elements(self) -> bool:
        """Whether each payload element takes a whole PRG block (F_p keys of version 1)."""
        return self.prime and self.version == FORMAT_VERSION

    @property
    def words_per_element(self) -> int:
        """64-bit PRG words per payload element: one (Z_{2^k}, and F_p from version 2: 61 bits of a
        word, rejection-sampled), or a whole block (F_p version 1, reduced from 128 bits)."""
        return 2 if self.block_elements else 1

    @property
    def seed_leaf(self) -> bool:
        """Whether Convert(leaf seed) reads the payload from the seed itself, no LEAF block: width 1
        (the ring's high word, F_p's 127 bits mod p or low 61 bits), or width 2 over F_p version 2."""
        return self.width == 1 or (self.prime and not self.block_elements and self.width == 2)

    @property
    def leaf_blocks(self) -> int:
        """LEAF blocks that convert one leaf seed into its payload."""
        return 0 if self.seed_leaf else (self.width if self.block_elements else self.value_blocks)

    @property
    def value_blocks(self) -> int:
        """AES blocks that hold one payload vector: each element takes one 64-bit word (two for F_p)."""
        return (self.width * self.words_per_element + 1) // 2

    @property
    def eval_blocks(self) -> int:
        """AES blocks one level of a single-point eval costs: the child's seed, plus (DCF) the value
        blocks that hold its payload words."""
        return 1 + (self.value_blocks if self.level_payload else 0)

    @property
    def expand_blocks(self) -> int:
        """AES blocks expanding both children of a node costs: two seeds, plus (DCF) `width` value blocks."""
        return 2 + (self.width * self.words_per_element if self.level_payload else 0)

    @property
    def v_levels(self) -> int:
        """Number of payload correction words per key: one per level and the leaf (DCF), or the leaf (DPF)."""
        return self.bits + 1 if self.level_payload else 1

    @property
    def mask(self) -> int:
        """2^out_bits - 1 (for F_p this is p itself: canonical elements are below it)."""
        return (1 << self.out_bits) - 1

    @property
    def domain_mask(self) -> int:
        return (1 << self.bits) - 1

    @property
    def input_xor(self) -> int:
        """Constant c with (x cmp alpha) == (x^c < alpha^c) (or ==): flips the sign bit for signed
        inputs and complements every bit for gt/ge, so one tree walk serves every comparison."""
        c = 1 << (self.bits - 1) if self.signed else 0
        if self.cmp in ("gt", "ge"):
            c ^= self.domain_mask
        return c

    @property
    def beta_below(self) -> bool:
        """Whether beta is output for internal x < alpha (every DCF variant)."""
        return self.kind == KIND_DCF

    @property
    def beta_equal(self) -> bool:
        """Whether beta is output for x == alpha (le, ge, and the DPF)."""
        return self.cmp in ("le", "ge", "eq")

    @property
    def t_bytes(self) -> int:
        return (2 * self.bits + 7) // 8

    @property
    def v_bytes(self) -> int:
        return (self.v_levels * self.width * self.out_bits + 7) // 8

    @property
    def body_len(self) -> int:
        """Bytes of one key after its header: root seed, seed corrections, t bits, payload corrections."""
        return LAMBDA_BYTES * (1 + self.bits) + self.t_bytes + self.v_bytes

    @property
    def key_size(self) -> int:
        return HEADER_LEN + self.body_len

    @property
    def formula_bits(self) -> int:
        """Key size in bits by the paper's formula (BCG+21 for the DCF, BGI16 for the DPF)."""
        lam, n, lw = 128, self.bits, self.out_bits * self.width
        if self.level_payload:
            return lam + n * (lam + 2 + lw) + lw
        return lam + n * (lam + 2) + lw

    def domain_range(self) -> tuple[int, int]:
        """Inclusive range of valid inputs and alphas."""
        if self.signed:
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, self.domain_mask

    def flags(self) -> int:
        return CMP_CODES[self.cmp] | (SIGNED_FLAG if self.signed else 0) | (PRIME_FLAG if self.prime else 0)

    def header(self, party: int, batch: bool = False) -> bytes:
        kind = self.kind | (BATCH_FLAG if batch else 0)
        return bytes([self.version, kind, party, self.bits, self.out_bits, self.flags()]) + self.width.to_bytes(2, "little")

    def describe(self) -> str:
        name = "DCF" if self.kind == KIND_DCF else "DPF"
        sign = ", signed" if self.signed else ""
        group = (", group=p61" + (f", version={self.version}" if self.version != PACKED_VERSION else "")) if self.prime else ""
        return f"{name}(bits={self.bits}, out_bits={self.out_bits}, width={self.width}, cmp={self.cmp}{sign}{group})"

