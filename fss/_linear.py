"""Linear sketches of one key's grid values over F_p (p = 2^61 - 1), for `_gridsums.eval_grid_sums` (the
grid kernel of `fast` reduces each key's row while it is in cache: `lane_sketch` in vector lanes, or
`row_sketch` where a lane would not always hold the same column of the row) and for the other backends
(`sums_of`, on a whole `eval_grid` output). All give canonical residues of the same sums mod p, so
the results are equal bit for bit; every value and weight must be canonical (below p < 2^61).

Per key, with its row y (size, width) of canonical values, weights W (q, size, c) below p and column
offsets o (q,):  dots[j] = sum_i sum_{e < c} W[j, i, e] y[i, o_j + e]  (mod p, canonical); the column
sums add y[:, :c] (`row_sketch`: into `col` of size * c entries) or the whole row (`lane_sketch`: size *
width entries, the caller keeps the first c of each point), below p after each fold, at most 4 keys
between folds, so below 5p; `last` is y[size - 1]. A product of two elements is below 2^122, so a
128-bit accumulator (`mac`: one 64 x 64 -> 128-bit multiply and an add/adc pair on x86-64) takes
FOLD_EVERY = 32 of them before it is folded into a field element.
"""
from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _cache


_P = np.uint64((1 << 61) - 1)
_I64, _I128 = ir.IntType(64), ir.IntType(128)
FOLD_EVERY = 32  # products of two field elements a 128-bit accumulator takes between folds


@njit(inline="always")
def fold(x):
    """Any uint64 -> its canonical element."""
    x = (x & _P) + (x >> np.uint64(61))
    return x - _P if x >= _P else x


@intrinsic
def mac(typingctx, lo, hi, a, b):
    """(lo, hi) + a * b: a 128-bit accumulator (lo + 2^64 hi) plus a full 64 x 64 -> 128-bit product,
    wrapping; the callers keep it below 2^128."""
    sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64, types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        lo, hi, a, b = args
        acc = builder.or_(builder.zext(lo, _I128), builder.shl(builder.zext(hi, _I128), ir.Constant(_I128, 64)))
        acc = builder.add(acc, builder.mul(builder.zext(a, _I128), builder.zext(b, _I128)))
        parts = [builder.trunc(acc, _I64), builder.trunc(builder.lshr(acc, ir.Constant(_I128, 64)), _I64)]
        return context.make_tuple(builder, signature.return_type, parts)

    return sig, codegen


@njit(inline="always")
def fold128(lo, hi):
    """lo + 2^64 hi (mod p), canonical, for any 64-bit lo and hi (2^64 = 8 mod p)."""
    return fold((lo & _P) + (lo >> np.uint64(61)) + ((hi << np.uint64(3)) & _P) + (hi >> np.uint64(58)))


@njit(inline="always")
def no_sketch(row, wf, dots, col, last):
    """The plain grid kernel's `row_sketch` (never called)."""


MAX_DOTS = 3  # dots the grid kernel's scalar sketch takes (one loop, three accumulators); more: the lane sketch
MAX_LANE_DOTS = 8  # dots the lane sketch takes (the calibration check's six; more: `sums_of` on eval_grid)


@functools.lru_cache(maxsize=None)
def row_sketch(width: int, c: int, offs: tuple):
    """`key_sums` for one shape, its constants compiled in: the row's width, c and the (at most
    MAX_DOTS) offsets. The dots go through one loop over the row with an accumulator each (their
    products overlap); with the offsets and c as runtime values (a gather into contiguous columns
    first, then the same loop) the grid kernel's sketch took 1.4x as long as `sums_of`'s whole pass."""
    q = len(offs)
    ja, jb, jc = 0, min(1, q - 1), min(2, q - 1)  # fewer than three: the last dot again
    u = np.uint64  # unsigned indices: numba adds no negative-index fix-up, which took registers in the loop
    w_, c_, oa, ob, oc = u(width), u(c), u(offs[ja]), u(offs[jb]), u(offs[jc])
    per = u(max(1, FOLD_EVERY // c))

    @njit(inline="always")
    def sketch(row, wf, dots, col, last):
        size = u(wf.shape[1]) // c_
        wa, wb, wc = wf[ja], wf[jb], wf[jc]
        sa = sb = sc = u(0)
        for i0 in range(u(0), size, per):
            al = ah = bl = bh = cl = ch = u(0)
            for i in range(i0, min(i0 + per, size)):
                for e in range(c_):
                    x, at = i * w_ + e, i * c_ + e
                    al, ah = mac(al, ah, row[x + oa], wa[at])
                    bl, bh = mac(bl, bh, row[x + ob], wb[at])
                    cl, ch = mac(cl, ch, row[x + oc], wc[at])
            sa = fold(sa + fold128(al, ah))
            sb = fold(sb + fold128(bl, bh))
            sc = fold(sc + fold128(cl, ch))
        dots[ja], dots[jb], dots[jc] = sa, sb, sc
        for i in range(size):
            for e in range(c_):
                col[i * c_ + e] += row[i * w_ + e]
        for e in range(w_):
            last[e] = row[(size - u(1)) * w_ + e]

    return sketch


@njit(inline="always")
def fold_all(col):
    for j in range(col.shape[0]):
        col[j] = fold(col[j])


@_cache.njit(nogil=True)  # the on-disk cache of every fss kernel (`fss._cache`)
def sums_of(y, weights, offs):
    """The sketch of every row of y (n, size, width), canonical: (dots (n, q), col (size, c), last
    (n, width)), as `eval_grid_sums` returns them (residues mod p: the same bits however summed)."""
    n, size, width = y.shape
    q, c = weights.shape[0], weights.shape[2]
    dots = np.zeros((n, q), np.uint64)
    col = np.zeros(size * c, np.uint64)
    last = np.zeros((n, width), np.uint64)
    for k in range(n):
        for j in range(q):
            s = lo = hi = np.uint64(0)
            m = 0  # products in the accumulator: folded every FOLD_EVERY, whatever c is
            for i in range(size):
                for e in range(c):
                    lo, hi = mac(lo, hi, y[k, i, offs[j] + e], weights[j, i, e])
                    m += 1
                    if m == FOLD_EVERY:
                        s, lo, hi, m = fold(s + fold128(lo, hi)), np.uint64(0), np.uint64(0), 0
            dots[k, j] = fold(s + fold128(lo, hi))
        for i in range(size):
            for e in range(c):
                col[i * c + e] += y[k, i, e]
        for e in range(width):
            last[k, e] = y[k, size - 1, e]
        if k % 4 == 3:
            fold_all(col)
    fold_all(col)
    return dots, col.reshape(size, c), last


# --- the same sketch in vector lanes: 32 x 32 -> 64-bit products (vpmuludq), no 128-bit carries ------------
# A 64 x 64 -> 128-bit product and its add/adc pair took about 3.8 cycles on AMD Zen 4 (one dot over a row in
# cache, not from a table), so the three dots of round one's check cost more than half the grid walk. In
# lanes: y = y0 + 2^31 y1 and w = w0 + 2^31 w1 (y0, w0 < 2^31; y1, w1 < 2^30, as y, w < 2^61), so with
# 2^62 = 2 (mod p)  y w = (y0 w0 + 2 y1 w1) + 2^31 (y0 w1 + y1 w0), four products below 2^62 that a lane
# adds in 64 bits (L: two steps, M: four, before a fold).
LANE_STEPS = 8  # vectors per unrolled chunk of the lane loop (L folds every 2, M every 4, both at the end)
_M31, _M32 = (1 << 31) - 1, (1 << 32) - 1


def lanes_for(tier: str) -> int:
    """Words per vector of the lane sketch on a tier: 8 with AVX-512, else 4 (LLVM splits a wider
    vector into the CPU's own)."""
    return 8 if tier == "vaes" else 4


@functools.lru_cache(maxsize=None)
def lane_streams(width: int, c: int, offs: tuple, lanes: int) -> tuple | None:
    """Which dot each word of a row feeds, packed into as few weight streams as possible: a tuple of
    streams, each a tuple over the row's columns e < width of a dot index or -1 (dots on disjoint
    columns share a stream: round one's z of the values and z of the tags). Where a lane does not
    always hold the same column (width not dividing lanes: the calibration check's width 6), one
    stream per dot, unpacked: a stream's every lane then sums that dot alone (its weights are 0 on the
    other columns), whatever column a lane holds. None beyond MAX_LANE_DOTS dots (`sums_of` runs)."""
    if len(offs) > MAX_LANE_DOTS:
        return None
    if lanes % width:
        return tuple(tuple(j if o <= e < o + c else -1 for e in range(width)) for j, o in enumerate(offs))
    streams: list[list[int]] = []
    for j, o in enumerate(offs):
        cols_j = range(o, o + c)
        for s in streams:
            if all(s[e] < 0 for e in cols_j):
                for e in cols_j:
                    s[e] = j
                break
        else:
            s = [-1] * width
            for e in cols_j:
                s[e] = j
            streams.append(s)
    return tuple(tuple(s) for s in streams)


def lane_weights(weights: np.ndarray, offs, width: int, streams: tuple) -> np.ndarray:
    """weights (q, size, c) canonical -> the streams' weights over a whole row, flat (S * size * width,),
    each word w split as w0 | w1 << 32 (w0 = w & (2^31 - 1), w1 = w >> 31); 0 where no dot reads."""
    q, size, c = weights.shape
    out = np.zeros((len(streams), size, width), np.uint64)
    for t, s in enumerate(streams):
        for e, j in enumerate(s):
            if j >= 0:
                out[t, :, e] = weights[j, :, e - int(offs[j])]
    w = out.reshape(-1)
    return (w & np.uint64(_M31)) | ((w >> np.uint64(31)) << np.uint64(32))


@functools.lru_cache(maxsize=None)
def _lane_chunks(streams: tuple, width: int, lanes: int, q: int):
    """The intrinsic chunks(row, ws, col, dots, n_chunks): over the first n_chunks * LANE_STEPS * lanes
    words of the row, col += row (lane-wise, unreduced) and dots[j] = the canonical dot of dot j's
    words (overwritten), the lanes of every stream reduced and added at the end."""
    V = ir.VectorType(_I64, lanes)
    S = len(streams)

    def vc(x):
        return ir.Constant(V, [x] * lanes)

    @intrinsic
    def chunks(typingctx, row, ws, col, dots, n_chunks):
        sig = types.void(row, ws, col, dots, types.int64)

        def codegen(context, b, signature, args):
            rowp, wsp, colp, dotp = (context.make_array(signature.args[q_])(context, b, args[q_]).data for q_ in range(4))
            stride = b.udiv(b.extract_value(context.make_array(signature.args[1])(context, b, args[1]).shape, 0), ir.Constant(_I64, S))
            p = vc(int(_P))

            def at(ptr, i):
                return b.bitcast(b.gep(ptr, [i]), V.as_pointer())

            def fold_v(x):
                return b.add(b.and_(x, p), b.lshr(x, vc(61)))

            def canon_v(x):  # x < 2^62 -> canonical
                x = fold_v(x)
                return b.select(b.icmp_unsigned(">=", x, p), b.sub(x, p), x)

            keep = [(cgutils.alloca_once_value(b, vc(0)), cgutils.alloca_once_value(b, vc(0))) for _ in range(S)]
            with cgutils.for_range(b, args[4]) as loop:
                base = b.mul(loop.index, ir.Constant(_I64, LANE_STEPS * lanes))
                acc = [[b.load(rl), b.load(rm)] for rl, rm in keep]
                lm = [[vc(0), vc(0)] for _ in range(S)]
                for s in range(LANE_STEPS):
                    off = b.add(base, ir.Constant(_I64, s * lanes))
                    y = b.load(at(rowp, off), align=8)
                    b.store(b.add(b.load(at(colp, off), align=8), y), at(colp, off), align=8)
                    y0 = b.and_(y, vc(_M31))
                    y1 = b.and_(b.lshr(y, vc(31)), vc(_M32))
                    y1d = b.and_(b.lshr(y, vc(30)), vc(_M32 ^ 1))  # 2 y1
                    for t in range(S):
                        w = b.load(at(wsp, b.add(off, b.mul(stride, ir.Constant(_I64, t)))), align=8)
                        w0, w1 = b.and_(w, vc(_M32)), b.lshr(w, vc(32))
                        lm[t][0] = b.add(lm[t][0], b.add(b.mul(y0, w0), b.mul(y1d, w1)))
                        lm[t][1] = b.add(lm[t][1], b.add(b.mul(y0, w1), b.mul(y1, w0)))
                        if s % 2 == 1:
                            acc[t][0], lm[t][0] = b.add(acc[t][0], fold_v(lm[t][0])), vc(0)
                        if s % 4 == 3:
                            acc[t][1], lm[t][1] = b.add(acc[t][1], fold_v(lm[t][1])), vc(0)
                for t, (rl, rm) in enumerate(keep):
                    b.store(fold_v(acc[t][0]), rl)
                    b.store(fold_v(acc[t][1]), rm)
            sums = [ir.Constant(_I64, 0)] * q
            for t, (rl, rm) in enumerate(keep):
                m = canon_v(b.load(rm))  # times 2^31 mod p: a 61-bit rotation by 31
                rot = b.or_(b.and_(b.shl(m, vc(31)), p), b.lshr(m, vc(30)))
                v = canon_v(b.add(canon_v(b.load(rl)), rot))
                single = {j for j in streams[t] if j >= 0}  # an unpacked stream: every lane is its one dot's
                for lane in range(lanes):
                    j = next(iter(single)) if len(single) == 1 else streams[t][lane % width]
                    if j >= 0:
                        sums[j] = b.add(sums[j], b.extract_element(v, ir.Constant(ir.IntType(32), lane)))
            pp = ir.Constant(_I64, int(_P))
            for j in range(q):  # at most 8 canonical values: below 2^64
                x = sums[j]
                x = b.add(b.and_(x, pp), b.lshr(x, ir.Constant(_I64, 61)))
                x = b.select(b.icmp_unsigned(">=", x, pp), b.sub(x, pp), x)
                b.store(x, b.gep(dotp, [ir.Constant(_I64, j)]))
            return context.get_dummy_value()

        return sig, codegen

    return chunks


@functools.lru_cache(maxsize=None)
def lane_sketch(width: int, c: int, offs: tuple, lanes: int):
    """`row_sketch`'s contract with wf the streams' split weights (`lane_weights`) and col the whole row's
    column sums (size * width; the caller keeps the first c of each point): the chunks in lanes, the
    rest of the row (fewer than LANE_STEPS * lanes words) with 128-bit products."""
    streams = lane_streams(width, c, offs, lanes)
    q = len(offs)
    chunks = _lane_chunks(streams, width, lanes, q)
    owner = np.array(streams, np.int64)
    u = np.uint64
    per, w_, m32 = LANE_STEPS * lanes, u(width), u(_M32)

    @njit(inline="always")
    def sketch(row, wf, dots, col, last):
        n = row.shape[0]
        done = n // per
        chunks(row, wf, col, dots, done)
        stride = wf.shape[0] // owner.shape[0]
        for x in range(done * per, n):
            col[x] += row[x]
            e = x % width
            for t in range(owner.shape[0]):
                j = owner[t, e]
                if j >= 0:
                    w = wf[t * stride + x]
                    lo, hi = mac(u(0), u(0), row[x], (w & m32) + ((w >> u(32)) << u(31)))
                    dots[j] = fold(dots[j] + fold128(lo, hi))
        for e in range(w_):
            last[e] = row[n - width + e]

    return sketch
