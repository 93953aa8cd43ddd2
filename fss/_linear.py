"""Linear sketches of one key's grid values over F_p (p = 2^61 - 1), for `_gridsums.eval_grid_sums` (the
grid kernel of `fast` runs `row_sketch` on each key's row while it is in cache) and for the other backends
(`sums_of`, on a whole `eval_grid` output). Both give canonical residues of the same sums mod p, so
the results are equal bit for bit.

Per key, with its row y (size, width) of canonical values, weights W (q, size, c) below p and column
offsets o (q,):  dots[j] = sum_i sum_{e < c} W[j, i, e] y[i, o_j + e]  (mod p, canonical); the column
sums add y[:, :c] into `col` (size * c; below p after each fold, at most 4 keys between folds, so below
5p); `last` is y[size - 1]. A product of two elements is below 2^122, so a 128-bit accumulator (`mac`: one
64 x 64 -> 128-bit multiply and an add/adc pair on x86-64) takes FOLD_EVERY = 32 of them before it is
folded into a field element.
"""
from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


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


MAX_DOTS = 3  # dots the grid kernel's sketch takes (one loop, three accumulators); more: `sums_of` on eval_grid


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


@njit(nogil=True, cache=True)
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
