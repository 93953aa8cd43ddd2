"""The full-grid kernel's inner step: 16 consecutive nodes of one key's tree, with the nodes in vector
lanes, expanded into their 32 children (or, at the last level, into the shares at 32 leaves).

Private; `fss.fast.eval_grid` drives it level by level over each key's nodes (in blocks of
subtrees, so that a level fits in cache), and `fss.portable.eval_grid` is the twin it must equal
bit for bit. Built from the AES rounds of `_aes` plus the payload arithmetic of either group: over
Z_{2^k} wrapping uint64 (masked at the leaf) as `_kernels` does it; over F_p (group "p61",
p = 2^61 - 1) with lazy reduction, since 2^61 = 1 and 2^64 = 8 (mod p):

    part(lo, hi) = (lo & p) + (lo >> 61) + ((hi << 3) & p) + (hi >> 58)  = lo + 2^64 hi (mod p), < 2^62 + 2^7
    half(x)      = (x & p) + (x >> 61)                                    = x (mod p), < 2^61 + 2^3
    level:  acc = half(acc + part(VALUE block side*width + e) + t * CW_i)   (acc < 2^61 + 8: no overflow)
    leaf:   y = canonical(acc + part(Convert(s)) + t * CW_{n+1}); party 1: p - y (0 stays 0)

with Convert(s) = s >> 1 (the 127-bit seed) for width 1, else LEAF block e: key format version 1
(`prime` = 1). Version 2 (`prime` = 2) reads element x = word & p of the ring's word instead of
part(block) (and at a leaf of width <= 2 the seed's own words, `prg.seed_word`); an x equal to p is
rejected by `fss.prg` and resampled, which this kernel does not do: it sets flags[0] instead, and
`fast` then hands that key to the portable backend (probability about 2^-61 an element). Every step is exact mod
p for corrections below p (all keys gen makes and the codec accepts), so the shares equal
`portable`'s (canonical F_p arithmetic, `fss.field`) bit for bit; `fast.eval_grid`
sends batches with unreduced corrections to the portable backend.

Nodes live in struct-of-arrays buffers (3 + width, capacity) uint64: rows seed lo, seed hi, t (0 or
1), acc[width]. A key's correction words come as kcw (bits + 1, 3 + width) uint64: row i = (seed
lo, seed hi, t bits (bit 0 left, bit 1 right), payload[width]) of level i; row `bits` holds the leaf
payload correction CW_{n+1} in its payload columns.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import _aes as A
from ._fused import _c64, _off, _Ptr, _words
from .params import PRIME
from .prg import ROLE_LEAF, ROLE_LEFT, ROLE_VALUE

HALVES = 2  # a step takes 16 nodes: two vectors of 8
# children of 8 nodes in node order: left of node 0, right of node 0, left of node 1, ...
_ZIP_LO = ir.Constant(ir.VectorType(A.I32, 8), [0, 8, 1, 9, 2, 10, 3, 11])
_ZIP_HI = ir.Constant(ir.VectorType(A.I32, 8), [4, 12, 5, 13, 6, 14, 7, 15])


def _concat(b, vectors: list):
    """<8 x i64> vectors -> one <8 len x i64> vector, in order."""
    while len(vectors) > 1:
        nxt = []
        for a in range(0, len(vectors) - 1, 2):
            x, y = vectors[a], vectors[a + 1]
            nx, ny = x.type.count, y.type.count
            if nx != ny:  # pad the shorter (last) one with undefined lanes
                y = b.shuffle_vector(y, ir.Constant(y.type, ir.Undefined), ir.Constant(ir.VectorType(A.I32, nx), list(range(ny)) + [ny] * (nx - ny)))
            mask = list(range(nx)) + [nx + q for q in range(ny)]
            nxt.append(b.shuffle_vector(x, y, ir.Constant(ir.VectorType(A.I32, len(mask)), mask)))
        if len(vectors) % 2:
            nxt.append(vectors[-1])
        vectors = nxt
    return vectors[0]


def _aos(width: int, reverse: bool) -> ir.Constant:
    """Shuffle mask: lanes 8 e + leaf (element-major) -> leaf * width + e, leaves reversed if asked."""
    order = [8 * e + (7 - q if reverse else q) for q in range(8) for e in range(width)]
    return ir.Constant(ir.VectorType(A.I32, 8 * width), order)


class Rejections:
    """Key format 2's elements in a kernel: word & p, with the lanes where that is p (rejected: `prg.resample`
    would draw again) noted, and flagged once per call. For vector helpers with a builder `b` and p
    splatted in `p` (`_Prime` here, `_blockgrid._Ops`)."""

    rejected = None  # <lanes x i1>: some element of the lane was p since the last `flag`

    def element(self, word):
        """word & p, in [0, p]; notes in `rejected` where it is p."""
        b = self.b
        x = b.and_(word, self.p)
        hit = b.icmp_unsigned("==", x, self.p)
        self.rejected = hit if self.rejected is None else b.or_(self.rejected, hit)
        return x

    def flag(self, ptr) -> None:
        """flags[0] |= 1 if an element since the last call was rejected (one scalar store at most)."""
        if self.rejected is None:
            return
        b = self.b
        bits = b.zext(b.bitcast(self.rejected, ir.IntType(self.rejected.type.count)), A.I64)
        with b.if_then(b.icmp_unsigned("!=", bits, _c64(0)), likely=False):
            b.store(b.or_(b.load(ptr), _c64(1)), ptr)
        self.rejected = None


class _Prime(Rejections):
    """F_p arithmetic on <8 x i64> vectors, reduced lazily (see the module docstring)."""

    def __init__(self, b: ir.IRBuilder, words: bool = False):
        self.b = b
        self.p = A.const8(PRIME)
        self.words = words  # key format version 2: elements are words & p (`element`)

    def half(self, x):
        """x mod p, in [0, 2^61 + 8) for any uint64 x."""
        b = self.b
        return b.add(b.and_(x, self.p), b.lshr(x, A.const8(61)))

    def part(self, lo, hi):
        """lo + 2^64 hi mod p, in [0, 2^62 + 2^7)."""
        b = self.b
        hi8 = b.add(b.and_(b.shl(hi, A.const8(3)), self.p), b.lshr(hi, A.const8(58)))
        return b.add(self.half(lo), hi8)

    def canonical(self, x):
        """x mod p in [0, p) for any uint64 x."""
        b = self.b
        y = self.half(x)
        return b.select(b.icmp_unsigned(">=", y, self.p), b.sub(y, self.p), y)

    def neg(self, a):
        b = self.b
        zero = A.const8(0)
        return b.select(b.icmp_unsigned("!=", a, zero), b.sub(self.p, a), zero)


class _Mmo:
    """AES-128 MMO, AES_K(x) xor x, of whole registers of blocks (4 a register), on inputs that come
    already whitened, x xor K_0 (the first round key): the callers fold K_0 into the constant they
    xor into every block, and AES_K(x) xor x = aesenclast(..., K_10 xor K_0) xor (x xor K_0). Uses
    the round keys of an `_aes.AesRounds`."""

    def __init__(self, b: ir.IRBuilder, aes: A.AesRounds):
        self.b, self.aes = b, aes
        self.k0 = aes.wide(0)
        self.k_last = b.xor(aes.keys[10], aes.keys[0])

    def block(self, lo: int, hi: int):
        """The whitened constant block (lo, hi) xor K_0, in all 4 blocks of a register."""
        return self.b.xor(ir.Constant(A.V8, [lo, hi] * 4), self.k0)

    def __call__(self, regs: list) -> list:
        aes = self.aes
        st = aes.join(aes.encrypt(aes.split(regs), first=False, last=self.k_last))
        return [self.b.xor(e, x) for e, x in zip(st, regs)]


def _blocks(b, mmo: _Mmo, slo, shi, tweaks: list) -> list:
    """Whitened PRG inputs (s xor T) xor K_0 of 8 seeds for each tweak (lo, hi) in `tweaks`: two
    registers a tweak (seeds 0, 2, 4, 6 and 1, 3, 5, 7, as `_aes.interleave`)."""
    even, odd = A.interleave(b, slo, shi)  # the seeds as blocks, interleaved once for every tweak
    regs = []
    for lo, hi in tweaks:
        c = mmo.block(lo, hi)
        regs += [b.xor(even, c), b.xor(odd, c)]
    return regs


def _both_tweaks(width: int, has_v: bool, prime: int) -> list:
    """Tweaks that expand both children of a seed: LEFT, RIGHT, then the VALUE blocks of both
    children's payloads (width of them over the ring and F_p version 2, two words a block; 2 width
    over F_p version 1)."""
    values = [(j, ROLE_VALUE) for j in range(2 * width if prime == 1 else width)] if has_v else []
    return [(0, ROLE_LEFT), (0, ROLE_LEFT + 1)] + values


def _converts(b, mmo: _Mmo, F: _Prime | None, nodes: list, width: int) -> list:
    """Convert(leaf seed) of each node (8 leaves each), one AES call for all of them: per node, the
    width elements. Ring: the seed's high word for width 1, else LEAF blocks' words; F_p version 1:
    see above; version 2: the seed's words (bits 1..61, 62..122) for width <= 2, else the LEAF blocks'
    words as the ring's, each through `F.element`."""
    one = A.const8(1)
    if F is not None and F.words and width <= 2:
        element_words = [b.or_(b.lshr(n[0], one), b.shl(n[1], A.const8(63))) for n in nodes], \
                        [b.or_(b.lshr(n[0], A.const8(62)), b.shl(n[1], A.const8(2))) for n in nodes]
        return [[F.element(element_words[e][k]) for e in range(width)] for k in range(len(nodes))]
    if width == 1:
        if F is None:
            return [[n[1]] for n in nodes]
        return [[F.part(b.or_(b.lshr(n[0], one), b.shl(n[1], A.const8(63))), b.lshr(n[1], one))] for n in nodes]
    blocks = width if F is not None and not F.words else (width + 1) // 2
    regs = []
    for n in nodes:
        regs += _blocks(b, mmo, n[0], n[1], [(q, ROLE_LEAF) for q in range(blocks)])
    words = _words(b, mmo(regs))
    out = []
    for k in range(len(nodes)):
        mine = words[2 * blocks * k : 2 * blocks * (k + 1)]
        if F is None:
            out.append(mine[:width])
        elif F.words:
            out.append([F.element(w) for w in mine[:width]])
        else:
            out.append([F.part(mine[2 * e], mine[2 * e + 1]) for e in range(width)])
    return out


_LANES = ir.Constant(ir.VectorType(A.I64, 8), list(range(8)))
_REV8 = ir.Constant(ir.VectorType(A.I32, 8), list(range(7, -1, -1)))


def _store_leaves(b, O, whole, first, width: int, origin, lo, hi, reverse, plain_when_full: bool = False) -> None:
    """Shares of the 8 leaves at child positions first .. first + 7 (`whole`: <8 width x i64>,
    element-major, lane 8 e + leaf) into the output O, read as one flat array of (leaf, element)
    words: position p at (origin + p) * width + e, or with `reverse` at (origin - p) * width + e;
    only positions lo <= p < hi are written (a masked store: the other lanes are garbage, and
    their words may belong to another key or lie outside O)."""
    pos = b.add(A.splat(b, first), _LANES)
    valid = b.and_(b.icmp_signed(">=", pos, A.splat(b, lo)), b.icmp_signed("<", pos, A.splat(b, hi)))
    rvalid = b.shuffle_vector(valid, valid, _REV8)
    fwd = b.shuffle_vector(whole, whole, _aos(width, False))
    rev = b.shuffle_vector(whole, whole, _aos(width, True))
    at = b.select(reverse, b.sub(b.sub(origin, first), _c64(7)), b.add(origin, first))  # leaf of store lane 0
    mask = b.select(reverse, rvalid, valid)
    if width > 1:  # one mask bit a word
        mask = b.shuffle_vector(mask, mask, ir.Constant(ir.VectorType(A.I32, 8 * width), [q // width for q in range(8 * width)]))
    vt = whole.type
    ptr = b.bitcast(O.at(b.mul(at, _c64(width))), vt.as_pointer())
    fn = _masked_store(b, vt)
    value = b.select(reverse, rev, fwd)
    if not plain_when_full:
        b.call(fn, [value, ptr, ir.Constant(A.I32, 8), mask])
        return
    # AVX2 (vpmaskmovq) masked stores are slow on AMD: a plain store when all 8 leaves are in range
    full = b.and_(b.icmp_signed(">=", first, lo), b.icmp_signed("<=", b.add(first, _c64(8)), hi))
    with b.if_else(full) as (whole_store, masked):
        with whole_store:
            b.store(value, ptr, align=8)
        with masked:
            b.call(fn, [value, ptr, ir.Constant(A.I32, 8), mask])


def _masked_store(b, vt: ir.VectorType) -> ir.Function:
    name = f"llvm.masked.store.v{vt.count}i64.p0"
    try:
        return b.module.get_global(name)
    except KeyError:
        fty = ir.FunctionType(ir.VoidType(), [vt, vt.as_pointer(), A.I32, ir.VectorType(ir.IntType(1), vt.count)])
        return ir.Function(b.module, fty, name=name)


@functools.lru_cache(maxsize=None)
def grid_step(width: int, has_v: bool, prime: int, tier: str):
    """The intrinsic step(src, i, dst, j, kcw, level, leaf, out, origin, lo, hi, reverse, party, mask,
    rk, flags): `prime` 0 (ring), 1 or 2 (F_p key format version); expands the 16 nodes src[:, i .. i + 15] of one key at `level` into both children, written
    in node order (left and right child of node i, then of node i + 1, ...) to dst[:, j .. j + 31].
    With `leaf` (level is the last) the children are leaves, and their shares, (-1)^party (acc +
    Convert(s) + t * CW_{n+1}) masked with `mask` over the ring, canonical over F_p, go straight to
    the output `out` (any C-contiguous uint64 array, read as flat (leaf, element) words) as
    `_store_leaves` says: child position p (j .. j + 31) at leaf origin + p, or origin - p with
    `reverse`, for lo <= p < hi only; dst is not touched. src, dst: node buffers (3 + width,
    capacity), capacity >= i + 16 and >= j + 32 (lanes past the real nodes compute garbage that
    nobody reads)."""
    rows = 3 + width
    i64 = types.int64

    @intrinsic
    def step(typingctx, src, i, dst, j, kcw, level, leaf, out, origin, lo, hi, reverse, party, mask, rk, flags, live):
        sig = types.void(src, i64, dst, i64, kcw, i64, types.boolean, out, i64, i64, i64, types.boolean, i64, types.uint64, rk, flags, i64)

        def codegen(context, b, signature, args):
            aty = signature.args
            S, D, K, O = (_Ptr(context, b, aty[q], args[q]) for q in (0, 2, 4, 7))
            i_, j_, level_, leaf_ = args[1], args[3], args[5], args[6]
            origin_, lo_, hi_, reverse_, party_, mask_ = args[8:14]
            mmo = _Mmo(b, A.AesRounds(b, _Ptr(context, b, aty[14], args[14]).data, tier))
            flag_ptr = _Ptr(context, b, aty[15], args[15]).at(_c64(0))
            F = _Prime(b, prime == 2) if prime else None
            zero, one = A.const8(0), A.const8(1)

            def cw(row, col):
                return A.splat(b, b.load(K.at(_off(b, b.mul(row, _c64(rows)), _c64(col)))))

            cs_lo, cs_hi, ct = cw(level_, 0), cw(level_, 1), cw(level_, 2)
            cv = [cw(level_, 3 + e) for e in range(width)] if has_v else []

            def put(r, h, left, right):
                """Row r of dst at j + 16 h .. j + 16 h + 15: the two vectors' lanes zipped."""
                base = _off(b, b.mul(_c64(r), D.n), j_, _c64(16 * h))
                D.store8(base, b.shuffle_vector(left, right, _ZIP_LO))
                D.store8(b.add(base, _c64(8)), b.shuffle_vector(left, right, _ZIP_HI))

            def halves(hs):
                """The step for the halves hs (8 nodes each): their blocks in one MMO, then their children."""
                nodes = [[S.load8(_off(b, b.mul(_c64(r), S.n), i_, _c64(8 * h))) for r in range(rows)] for h in hs]
                regs = []
                for st in nodes:
                    regs += _blocks(b, mmo, st[0], st[1], _both_tweaks(width, has_v, prime))
                words = _words(b, mmo(regs))
                per = len(words) // len(hs)
                kids = []  # per half, per side: [seed lo, seed hi, t, acc...]
                for h, st in enumerate(nodes):
                    mine, t = words[per * h : per * (h + 1)], st[2]
                    tm = b.sub(zero, t)
                    pair = []
                    for side in (0, 1):
                        lo, hi = mine[2 * side], mine[2 * side + 1]
                        node = [b.xor(b.and_(lo, A.const8(~1 & (2**64 - 1))), b.and_(cs_lo, tm)), b.xor(hi, b.and_(cs_hi, tm)),
                                b.xor(b.and_(lo, one), b.and_(b.lshr(ct, A.const8(side)), b.and_(t, one)))]
                        for e in range(width):
                            if not has_v:
                                node.append(st[3 + e])
                                continue
                            c = b.and_(cv[e], tm)
                            q = side * width + e  # element q of the VALUE blocks (a block each over F_p, else a word)
                            if F is None:
                                node.append(b.add(st[3 + e], b.add(mine[4 + q], c)))
                            elif F.words:
                                node.append(F.half(b.add(b.add(st[3 + e], F.element(mine[4 + q])), c)))
                            else:
                                node.append(F.half(b.add(b.add(st[3 + e], F.part(mine[4 + 2 * q], mine[5 + 2 * q])), c)))
                        pair.append(node)
                    kids.append(pair)
                if F is not None:
                    F.flag(flag_ptr)  # the children's elements (those of the leaves' Convert: below)

                with b.if_else(leaf_) as (leaves, inner):
                    with leaves:
                        flat = [kids[q][side] for q in range(len(hs)) for side in (0, 1)]
                        convs = _converts(b, mmo, F, flat, width)
                        if F is not None:
                            F.flag(flag_ptr)
                        lv = [cw(b.add(level_, _c64(1)), 3 + e) for e in range(width)]  # row bits: CW_{n+1}
                        negate = b.icmp_signed("!=", party_, _c64(0))
                        vals = []  # per (half, side): width vectors
                        for q, node in enumerate(flat):
                            tm = b.sub(zero, node[2])
                            out = []
                            for e in range(width):
                                c = b.and_(lv[e], tm)
                                if F is None:
                                    v = b.add(b.add(node[3 + e], convs[q][e]), c)
                                    out.append(b.and_(b.select(negate, b.sub(zero, v), v), A.splat(b, mask_)))
                                else:
                                    v = F.canonical(b.add(b.add(node[3 + e], convs[q][e]), c))
                                    out.append(b.select(negate, F.neg(v), v))
                            vals.append(out)
                        for q, h in enumerate(hs):
                            for z, zip_ in enumerate((_ZIP_LO, _ZIP_HI)):
                                parts = [b.shuffle_vector(vals[2 * q][e], vals[2 * q + 1][e], zip_) for e in range(width)]
                                _store_leaves(b, O, _concat(b, parts), _off(b, j_, _c64(16 * h + 8 * z)), width, origin_, lo_, hi_, reverse_,
                                             not mmo.aes.vaes)
                    with inner:
                        for q, h in enumerate(hs):
                            for r in range(rows):
                                put(r, h, kids[q][0][r], kids[q][1][r])

            # 32 vector registers (AVX-512, NEON): both halves at once; 16 (AVX2): one half after the other,
            # so that one half's blocks and state fit in the registers (the AES rounds stay in flight), the
            # second only if the level has a node there (`live`: the top levels have 1 to 8).
            if mmo.aes.regs32:
                halves(list(range(HALVES)))
            else:
                halves([0])
                with b.if_then(b.icmp_signed(">", args[16], _c64(8))):
                    halves([1])
            return context.get_dummy_value()

        return sig, codegen

    return step

