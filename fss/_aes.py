"""AES-128 for the kernels: the fixed key's round keys, the CPU's AES features, and LLVM-IR helpers
that emit the AES-NI / VAES instructions (x86-64) or the ARMv8 crypto extension's AESE / AESMC
(aarch64) from numba intrinsics.

Private. The round keys come from the standard key schedule (FIPS-197, 5.2); `fss.backend` checks
the compiled kernels against pycryptodome before it selects them. Only the CPU's AES instructions are used:
no table-based software AES (it leaks timing), so a CPU without AES-NI takes the portable backend.
"""
from __future__ import annotations

import functools
import os
import platform

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

from .prg import FIXED_KEY

I32 = ir.IntType(32)
I64 = ir.IntType(64)
V2 = ir.VectorType(I64, 2)
V8 = ir.VectorType(I64, 8)
V16B = ir.VectorType(ir.IntType(8), 16)  # a NEON register as the AArch64 crypto intrinsics take it


def _sbox() -> list[int]:
    sbox = [0] * 256
    p = q = 1
    while True:  # walk the multiplicative group with generator 3 and its inverse
        p = p ^ ((p << 1) & 0xFF) ^ (0x1B if p & 0x80 else 0)
        q ^= q << 1
        q ^= q << 2
        q ^= q << 4
        q &= 0xFF
        if q & 0x80:
            q ^= 0x09
        rot = lambda v, r: ((v << r) | (v >> (8 - r))) & 0xFF  # noqa: E731
        sbox[p] = q ^ rot(q, 1) ^ rot(q, 2) ^ rot(q, 3) ^ rot(q, 4) ^ 0x63
        if p == 1:
            break
    sbox[0] = 0x63
    return sbox


def expand_key(key: bytes) -> np.ndarray:
    """AES-128 round keys of `key` as an (11, 2) uint64 array (little-endian words of each 16 bytes)."""
    sbox = _sbox()
    words = [list(key[4 * i : 4 * i + 4]) for i in range(4)]
    rcon = 1
    for i in range(4, 44):
        t = list(words[i - 1])
        if i % 4 == 0:
            t = [sbox[b] for b in t[1:] + t[:1]]
            t[0] ^= rcon
            rcon = ((rcon << 1) ^ (0x1B if rcon & 0x80 else 0)) & 0xFF
        words.append([a ^ b for a, b in zip(words[i - 4], t)])
    return np.frombuffer(bytes(sum(words, [])), "<u8").astype(np.uint64).reshape(11, 2)


@functools.lru_cache(maxsize=None)
def round_keys() -> np.ndarray:
    """The fixed PRG key's round keys (the kernels check them against pycryptodome at first use)."""
    return expand_key(FIXED_KEY)


@functools.lru_cache(maxsize=None)
def host_features() -> frozenset[str]:
    """The CPU features numba compiles for, as LLVM names ('aes', 'vaes', 'avx512f', 'neon', ...):
    NUMBA_CPU_FEATURES if set (numba then uses exactly those), else the host's as LLVM finds them."""
    feats = os.environ.get("NUMBA_CPU_FEATURES") or llvm.get_host_cpu_features().flatten()
    return frozenset(name.strip()[1:] for name in feats.split(",") if name.strip().startswith("+"))


def machine() -> str:
    """'x86_64', 'aarch64' or another architecture name (the kernels know the first two)."""
    m = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(m, m)


def has_aesni() -> bool:
    return machine() == "x86_64" and "aes" in host_features()


def has_vaes256() -> bool:
    """AVX2 with the VAES instructions on 256-bit (ymm) registers (Intel Ice Lake and later, AMD Zen 3+)."""
    return machine() == "x86_64" and {"aes", "vaes", "avx2"} <= host_features()


def has_vaes512() -> bool:
    f = host_features()
    return machine() == "x86_64" and {"aes", "vaes", "avx512f", "avx512bw"} <= f


def has_aarch64_aes() -> bool:
    """An aarch64 CPU with the ARMv8 crypto extension's AES instructions (AESE, AESMC): LLVM's "aes"."""
    return machine() == "aarch64" and "aes" in host_features()


# The fused tiers: AES blocks per instruction, and whether this CPU can run them.
TIERS = {"aarch64": 1, "aesni": 1, "vaes256": 2, "vaes": 4}
_SUPPORTED = {"aarch64": has_aarch64_aes, "aesni": has_aesni, "vaes256": has_vaes256, "vaes": has_vaes512}


def tier_name(tier) -> str:
    """A fused tier's name; the booleans of older callers map True to "vaes" and False to "aesni"."""
    if isinstance(tier, bool):
        return "vaes" if tier else "aesni"
    if tier not in TIERS:
        from .errors import ParameterError

        raise ParameterError(f"fused tier must be one of {tuple(TIERS)}, got {tier!r}")
    return tier


def supported(tier: str) -> bool:
    return _supported(tier_name(tier))


@functools.lru_cache(maxsize=None)
def _supported(name: str) -> bool:  # the CPU's features (`host_features`, `machine`) are fixed for the process
    return _SUPPORTED[name]()


def require(tier) -> str:
    """The tier's name if this CPU can run it, else FssError (no kernel is ever compiled for
    instructions the CPU lacks: LLVM would refuse them or the process would fault)."""
    name = tier_name(tier)
    if not supported(name):
        from .errors import FssError

        raise FssError(f"this CPU cannot run the {name!r} kernels")
    return name


# --- LLVM IR helpers -------------------------------------------------------------------------------
def declare(builder: ir.IRBuilder, name: str, vt: ir.Type) -> ir.Function:
    mod = builder.module
    try:
        return mod.get_global(name)
    except KeyError:
        return ir.Function(mod, ir.FunctionType(vt, [vt, vt]), name=name)


def declare_reduce(builder: ir.IRBuilder) -> ir.Function:
    """llvm.vector.reduce.add over <8 x i64> (a horizontal sum, wrapping)."""
    name = "llvm.vector.reduce.add.v8i64"
    try:
        return builder.module.get_global(name)
    except KeyError:
        return ir.Function(builder.module, ir.FunctionType(I64, [V8]), name=name)


def splat(builder: ir.IRBuilder, value: ir.Value, vt: ir.VectorType = V8) -> ir.Value:
    v = builder.insert_element(ir.Constant(ir.VectorType(value.type, 1), ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, vt.count), [0] * vt.count))


def const8(value: int) -> ir.Constant:
    return ir.Constant(V8, [value] * 8)


EVEN = ir.Constant(ir.VectorType(I32, 8), [0, 8, 2, 10, 4, 12, 6, 14])
ODD = ir.Constant(ir.VectorType(I32, 8), [1, 9, 3, 11, 5, 13, 7, 15])


def interleave(builder: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Eight lo words and eight hi words -> two registers of four AES blocks (keys 0,2,4,6 and 1,3,5,7)."""
    return builder.shuffle_vector(lo, hi, EVEN), builder.shuffle_vector(lo, hi, ODD)


def deinterleave(builder: ir.IRBuilder, even: ir.Value, odd: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Inverse of `interleave`: two registers of blocks -> eight lo words, eight hi words."""
    return builder.shuffle_vector(even, odd, EVEN), builder.shuffle_vector(even, odd, ODD)


class AesRounds:
    """Emits AES-128 MMO (AES_K(x) xor x) over a list of <8 x i64> registers (4 blocks each), with
    the instructions of a fused tier: "vaes" (512-bit VAES, one instruction a register), "vaes256"
    (256-bit VAES on AVX2, two), "aesni" (128-bit AES-NI, four), "aarch64" (AESE + AESMC on 128-bit
    NEON registers, four pairs). `keys` are the round keys at the tier's native width; `wide(r)` is
    round key r in all four blocks of an <8 x i64>.

    AESE(s, k) is SubBytes(ShiftRows(s xor k)) and AESMC is MixColumns, so x86's round structure
    (xor K_0, nine AESENC with K_1..K_9, AESENCLAST with K_10) is, on ARM, nine AESMC(AESE(s, K_r))
    for r = 0..8, then AESE(s, K_9) and xor K_10: the same function, bit for bit.

    AVX2 has 16 vector registers, so the 256- and 128-bit tiers run their rounds over `INFLIGHT`
    native registers at a time (enough independent instructions to cover the AES latency, few enough
    to stay in registers) instead of over all blocks at once; the 512-bit tier (32 registers) keeps
    all of them in flight."""

    INFLIGHT = {"aesni": 8, "vaes256": 8, "vaes": 0, "aarch64": 0}  # 0: every register at once
    # Round keys 1..REGKEYS of an inline chunk in registers (8 states + K_last + 6 keys: 15 of the 16),
    # the rest memory operands. Zen 3 loads at most two 256-bit operands a cycle, so at two VAES a
    # cycle with memory keys the key loads alone took every load slot, and each spill or node load
    # of the kernels around the chunks cost AES throughput. On the Zen 3 class EPYC, kernels built
    # both ways in one process: eval_grid of width 2 over F_p +16% (the spill-heavy grid step), width
    # 1 +3%, eval / gen / eval_sum unchanged. The AES-NI tier (128-bit keys) gained nothing: unchanged.
    REGKEYS = {"aesni": 0, "vaes256": 6, "vaes": 0, "aarch64": 0}

    def __init__(self, builder: ir.IRBuilder, rk_ptr: ir.Value, tier):
        tier = require(tier)  # never emit instructions the CPU lacks
        self.b, self.tier, self.vaes = builder, tier, tier == "vaes"
        self.arm = tier == "aarch64"
        self.regs32 = tier in ("vaes", "aarch64")  # 32 vector registers (AVX-512, NEON): more blocks in flight
        self.per = TIERS[tier]  # blocks per native register
        base = builder.bitcast(rk_ptr, V2.as_pointer())
        self.keys2 = [builder.load(builder.gep(base, [ir.Constant(I32, r)]), align=8) for r in range(11)]
        vt = ir.VectorType(I64, 2 * self.per)
        self.native = vt
        if self.arm:
            self.keys = self.keys2
            self.aese = declare(builder, "llvm.aarch64.crypto.aese", V16B)
            mod = builder.module
            try:
                self.aesmc = mod.get_global("llvm.aarch64.crypto.aesmc")
            except KeyError:
                self.aesmc = ir.Function(mod, ir.FunctionType(V16B, [V16B]), name="llvm.aarch64.crypto.aesmc")
            return
        if self.per == 1:
            self.keys = self.keys2
            self.enc = declare(builder, "llvm.x86.aesni.aesenc", V2)
            self.last = declare(builder, "llvm.x86.aesni.aesenclast", V2)
        else:
            bc = ir.Constant(ir.VectorType(I32, 2 * self.per), [0, 1] * self.per)
            self.keys = [builder.shuffle_vector(k, k, bc) for k in self.keys2]
            suffix = ".512" if self.per == 4 else ".256"
            self.enc = declare(builder, "llvm.x86.aesni.aesenc" + suffix, vt)
            self.last = declare(builder, "llvm.x86.aesni.aesenclast" + suffix, vt)
        if not self.vaes:
            llvm.initialize_native_asmparser()  # numba's object emitter assembles the inline blocks
            self.avx = "avx" in host_features()  # VEX encodings (no SSE/AVX transitions); else legacy SSE
            self.table = self._key_table()

    def _key_table(self) -> ir.Value:
        """The round keys at the native width in a stack slot of the function's entry block (written
        here, read by the inline assembly of `_chunk`)."""
        from numba.core import cgutils

        b = self.b
        slot = cgutils.alloca_once(b, ir.ArrayType(self.native, 11))
        for r in range(11):
            b.store(self.keys[r], b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, r)]), align=16)
        return b.bitcast(slot, ir.IntType(8).as_pointer())

    def wide(self, r: int) -> ir.Value:
        """Round key r in all four blocks of an <8 x i64> register."""
        k = self.keys2[r]
        return self.b.shuffle_vector(k, k, ir.Constant(ir.VectorType(I32, 8), [0, 1] * 4))

    def split(self, regs: list) -> list:
        """<8 x i64> registers -> native registers, in order (4 / per of them a register)."""
        if self.per == 4:
            return list(regs)
        b, w = self.b, 2 * self.per
        return [b.shuffle_vector(x, x, ir.Constant(ir.VectorType(I32, w), list(range(w * q, w * q + w)))) for x in regs
                for q in range(4 // self.per)]

    def join(self, parts: list) -> list:
        """Inverse of `split`."""
        b = self.b
        if self.per == 4:
            return list(parts)
        out = []
        if self.per == 2:
            for r in range(0, len(parts), 2):
                out.append(b.shuffle_vector(parts[r], parts[r + 1], ir.Constant(ir.VectorType(I32, 8), list(range(8)))))
            return out
        for r in range(0, len(parts), 4):
            q = parts[r : r + 4]
            lo = b.shuffle_vector(q[0], q[1], ir.Constant(ir.VectorType(I32, 4), [0, 1, 2, 3]))
            hi = b.shuffle_vector(q[2], q[3], ir.Constant(ir.VectorType(I32, 4), [0, 1, 2, 3]))
            out.append(b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 8), list(range(8)))))
        return out

    def encrypt(self, parts: list, first=None, last=None, inflight: int | None = None) -> list:
        """The ten AES rounds over native registers: xor `first` (default K_0; skipped if first is
        False), nine aesenc, aesenclast with `last` (default K_10). On the 16-register tiers, inline
        blocks of `INFLIGHT` registers, or with `inflight` the fewest blocks of at most that many,
        of equal size."""
        b = self.b
        k_first = self.keys[0] if first is None else first
        k_last = self.keys[10] if last is None else last
        if self.arm:
            return self._arm(parts, k_first, k_last)
        if k_first is not False:
            parts = [b.xor(x, k_first) for x in parts]
        if self.vaes:  # 32 registers: LLVM keeps every block in flight by itself
            st = parts
            for r in range(1, 10):
                st = [b.call(self.enc, [s, self.keys[r]]) for s in st]
            return [b.call(self.last, [s, k_last]) for s in st]
        if inflight is None:
            cuts = list(range(0, len(parts), self.INFLIGHT[self.tier])) + [len(parts)]
        else:
            count = -(-len(parts) // inflight)
            cuts = [len(parts) * c // count for c in range(count + 1)]
        out = []
        for c0, c1 in zip(cuts, cuts[1:]):
            out += self._chunk(parts[c0:c1], k_last)
        return out

    def _arm(self, parts: list, k_first, k_last) -> list:
        """The ten rounds with AESE / AESMC (see the class docstring): AESE xors its key in first, so
        K_0 (or `first`) is the first AESE's key, and a zero key when the inputs come whitened (first
        False). LLVM schedules them itself (32 NEON registers; AESE + AESMC pairs fuse on most cores)."""
        b = self.b
        zero = ir.Constant(V16B, [0] * 16)
        as_bytes = lambda v: b.bitcast(v, V16B)  # noqa: E731
        st = [as_bytes(x) for x in parts]
        first = zero if k_first is False else as_bytes(k_first)
        for r in range(9):
            key = first if r == 0 else as_bytes(self.keys[r])
            st = [b.call(self.aesmc, [b.call(self.aese, [s, key])]) for s in st]
        k9 = as_bytes(self.keys[9])
        return [b.xor(b.bitcast(b.call(self.aese, [s, k9]), V2), k_last) for s in st]

    def _chunk(self, st: list, k_last) -> list:
        """Rounds 1..10 of up to `INFLIGHT` registers as one inline-assembly block, round by round.
        With 16 vector registers, LLVM's scheduler otherwise runs the rounds of one register after
        the other (to save registers) and leaves one or two AES instructions in flight; the block
        keeps every register's round r before any round r + 1 (the AES latency hidden). Round keys
        1..REGKEYS come in registers, the others as memory operands (broadcast to the register width,
        `_key_table`)."""
        b, k = self.b, len(st)
        vt = self.native
        size = 16 * self.per
        vex = "v" if self.avx else ""
        nreg = min(self.REGKEYS[self.tier], 16 - 1 - k)  # 16 vector registers: k states, K_last, the keys
        lines = []
        for r in range(1, 10):
            key = f"${2 * k + 1 + r}" if r <= nreg else f"{size * r}($$KEYS)"
            for j in range(k):
                lines.append(f"{vex}aesenc {key}, ${j}" + (f", ${j}" if self.avx else ""))
        for j in range(k):
            lines.append(f"{vex}aesenclast ${2 * k + 1}, ${j}" + (f", ${j}" if self.avx else ""))
        # operands: k outputs, k tied inputs, the key table, K_last, round keys 1..nreg
        text = "\n\t".join(lines).replace("$$KEYS", f"${2 * k}")
        ret = ir.LiteralStructType([vt] * k) if k > 1 else vt
        cons = ",".join(["=x"] * k + [str(j) for j in range(k)] + ["r", "x"] + ["x"] * nreg)
        fty = ir.FunctionType(ret, [vt] * k + [self.table.type, vt] + [vt] * nreg)
        call = b.asm(fty, text, cons, list(st) + [self.table, k_last] + self.keys[1 : 1 + nreg], side_effect=True, name="aes")  # reads the key table: never moved above its stores
        return [b.extract_value(call, j) for j in range(k)] if k > 1 else [call]

    def mmo(self, regs: list[ir.Value]) -> list[ir.Value]:
        b = self.b
        enc = self.join(self.encrypt(self.split(regs)))
        return [b.xor(e, x) for e, x in zip(enc, regs)]
