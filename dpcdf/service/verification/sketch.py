"""The verification's hot loop (numba): per report, the weighted sums of its grid values that the
check needs (and, for count/label, its top entry), in F_p (p = 2^61 - 1). See `maths.Check.round_one`.

Single-threaded on purpose: the servers run them in their round-one worker thread while other
threads serve requests, and numba's "workqueue" threading layer (where neither TBB nor OpenMP is
installed) aborts the process when two threads launch parallel kernels at once."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# The same helpers as `fss._linear` (the grid kernel's sketch), copied, not imported: numba's cache of the
# kernels below (cache=True) checks only this file's freshness, so an edit of fss._linear would leave them stale
_P = np.uint64((1 << 61) - 1)
_I64, _I128 = ir.IntType(64), ir.IntType(128)
FOLD_EVERY = 32  # products of two field elements a 128-bit accumulator takes between folds


@njit(inline="always")
def _fold(x):
    x = (x & _P) + (x >> np.uint64(61))
    return x - _P if x >= _P else x


@intrinsic
def _mac(typingctx, lo, hi, a, b):
    """(lo, hi) + a * b: a 128-bit accumulator (lo + 2^64 hi) plus a full 64 x 64 -> 128-bit product
    (one `mul` and an add/adc pair on x86-64), wrapping; the callers keep it below 2^128."""
    sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64, types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        lo, hi, a, b = args
        acc = builder.or_(builder.zext(lo, _I128), builder.shl(builder.zext(hi, _I128), ir.Constant(_I128, 64)))
        acc = builder.add(acc, builder.mul(builder.zext(a, _I128), builder.zext(b, _I128)))
        parts = [builder.trunc(acc, _I64), builder.trunc(builder.lshr(acc, ir.Constant(_I128, 64)), _I64)]
        return context.make_tuple(builder, signature.return_type, parts)

    return sig, codegen


@njit(inline="always")
def _fold128(lo, hi):
    """lo + 2^64 hi (mod p), canonical, for any 64-bit lo and hi (2^64 = 8 mod p; 8 hi = its low 61
    bits + its bits from 61 up, which are hi >> 58)."""
    return _fold((lo & _P) + (lo >> np.uint64(61)) + ((hi << np.uint64(3)) & _P) + (hi >> np.uint64(58)))


@njit(cache=True)
def sketch(y, wz, wl, one):
    """y (n, N, w) canonical; wz, wl (N, w): z[k] = sum y[k] * wz, l[k] = sum y[k] * wl, and
    top[k] = one - sum_c y[k, N-1, c] (mod p).

    Each product of two elements below p is below 2^122, so a 128-bit accumulator takes FOLD_EVERY
    = 32 of them (below 2^127) before it is folded into a field element: one full-width multiply
    per weight and grid value (was four 31-bit partial products and more folds)."""
    n, size, width = y.shape
    m = size * width
    yf = y.reshape(n, m)
    wzf, wlf = wz.reshape(m), wl.reshape(m)
    z = np.empty(n, np.uint64)
    l = np.empty(n, np.uint64)
    top = np.empty(n, np.uint64)
    for k in range(n):
        z[k], l[k] = _dot2(yf[k], wzf, wlf)
        t = one
        for c in range(width):
            last = y[k, size - 1, c]
            t = t + _P - last if t < last else t - last
        top[k] = t
    return z, l, top


@njit(inline="always")
def _dot2(v, a, b):
    """(sum_j v[j] a[j], sum_j v[j] b[j]) mod p, canonical, over 1-d arrays of one length: blocks of
    FOLD_EVERY products per 128-bit accumulator (a fixed trip count, unrolled), each folded into a
    field element."""
    m = v.shape[0]
    full = m - m % FOLD_EVERY
    sa = sb = np.uint64(0)
    for j0 in range(0, full, FOLD_EVERY):
        al = ah = bl = bh = np.uint64(0)
        for j in range(j0, j0 + FOLD_EVERY):
            x = v[j]
            al, ah = _mac(al, ah, x, a[j])
            bl, bh = _mac(bl, bh, x, b[j])
        sa = _fold(sa + _fold128(al, ah))
        sb = _fold(sb + _fold128(bl, bh))
    al = ah = bl = bh = np.uint64(0)
    for j in range(full, m):
        x = v[j]
        al, ah = _mac(al, ah, x, a[j])
        bl, bh = _mac(bl, bh, x, b[j])
    return _fold(sa + _fold128(al, ah)), _fold(sb + _fold128(bl, bh))


@njit(inline="always")
def _dot1(v, a):
    """sum_j v[j] a[j] mod p, canonical (as `_dot2`, one sum)."""
    m = v.shape[0]
    full = m - m % FOLD_EVERY
    sa = np.uint64(0)
    for j0 in range(0, full, FOLD_EVERY):
        al = ah = np.uint64(0)
        for j in range(j0, j0 + FOLD_EVERY):
            al, ah = _mac(al, ah, v[j], a[j])
        sa = _fold(sa + _fold128(al, ah))
    al = ah = np.uint64(0)
    for j in range(full, m):
        al, ah = _mac(al, ah, v[j], a[j])
    return _fold(sa + _fold128(al, ah))


@njit(cache=True)
def sketch_mac(y, width, wz, wl, one, sums):
    """The MAC'd check's round one in one pass over y (n, N, 2 width), read once: the report's
    values in columns [0, width), their MAC tags (kappa times each) in [width, 2 width). Per report:
    z = sum values * wz, l = sum values * wl, top = one - sum_c values[N-1, c]; of the tags only
    what the opened elements' MAC needs: zt = sum tags * wz and topt = -sum_c tags[N-1, c] (the tags'
    l is never used). wz, wl (N, width). If sums has N * width entries (canonical, e.g. zeros), the
    values' column sums (`column_sums` of the value columns) are added into it mod p (the histogram
    share); pass an empty array to skip them. Returns (z, l, top, zt, topt), each (n,), canonical.

    Three full-width multiplies per value (was four, in two runs of `sketch` over two copies of y).
    Each report's row is first split into its values and its tags in two small buffers that stay in
    L1, then summed contiguously (`_dot2`, `_dot1`): at a 2^10 grid the pass is bound by reading y
    from memory (16 KiB per count report), which it now does once."""
    n, size, cols = y.shape
    m = size * width
    yf = y.reshape(n, size * cols)
    wzf, wlf = wz.reshape(m), wl.reshape(m)
    with_sums = sums.shape[0] == m
    vals = np.empty(m, np.uint64)
    tags = np.empty(m, np.uint64)
    z = np.empty(n, np.uint64)
    l = np.empty(n, np.uint64)
    top = np.empty(n, np.uint64)
    zt = np.empty(n, np.uint64)
    topt = np.empty(n, np.uint64)
    for k in range(n):
        row = yf[k]
        if width == 1:  # the common widths with constant strides (count, label)
            for i in range(size):
                vals[i] = row[2 * i]
                tags[i] = row[2 * i + 1]
        elif width == 2:
            for i in range(size):
                vals[2 * i] = row[4 * i]
                vals[2 * i + 1] = row[4 * i + 1]
                tags[2 * i] = row[4 * i + 2]
                tags[2 * i + 1] = row[4 * i + 3]
        else:
            for i in range(size):
                for c in range(width):
                    vals[i * width + c] = row[i * cols + c]
                    tags[i * width + c] = row[i * cols + width + c]
        z[k], l[k] = _dot2(vals, wzf, wlf)
        zt[k] = _dot1(tags, wzf)
        if with_sums:
            for j in range(m):
                sums[j] += vals[j]
            if k % 4 == 3:  # four values below p each since the last fold: below 2^64
                for j in range(m):
                    sums[j] = _fold(sums[j])
        t0 = one
        t1 = np.uint64(0)
        for c in range(width):
            last = vals[m - width + c]
            t0 = t0 + _P - last if t0 < last else t0 - last
            last = tags[m - width + c]
            t1 = t1 + _P - last if t1 < last else t1 - last
        top[k] = t0
        topt[k] = t1
    if with_sums:
        for j in range(m):
            sums[j] = _fold(sums[j])
    return z, l, top, zt, topt


@njit(cache=True)
def value_sums(y, width):
    """sum over k of y[k, :, :width] (N, width), mod p, read in place (no copy of the value columns):
    `column_sums` of the values of MAC'd grid values (n, N, 2 width)."""
    n, size, cols = y.shape
    m = size * width
    acc = np.zeros(m, np.uint64)
    for k in range(n):
        for i in range(size):
            for c in range(width):
                acc[i * width + c] += y[k, i, c]
        if k % 4 == 3:
            for j in range(m):
                acc[j] = _fold(acc[j])
    for j in range(m):
        acc[j] = _fold(acc[j])
    return acc.reshape(size, width)


@njit(cache=True)
def column_sums(y):
    """sum over k of y[k] (N, w), mod p: a server's share of the histogram. Rows are added in
    order (contiguous, vectorized); elements are below 2^61, so four of them fit in a uint64 before
    a fold."""
    n, size, width = y.shape
    m = size * width
    flat = y.reshape(n, m)
    acc = np.zeros(m, np.uint64)
    for k in range(n):
        row = flat[k]
        for j in range(m):
            acc[j] += row[j]
        if k % 4 == 3:
            for j in range(m):
                acc[j] = _fold(acc[j])
    for j in range(m):
        acc[j] = _fold(acc[j])
    return acc.reshape(size, width)



@njit(cache=True)
def sketch_calibration(y, w):
    """The four weighted sums of a calibration report's check (`maths.Check`, payload
    "calibration"): y (n, N, 3) canonical grid values of the components (1, label, q), w (N, 5)
    folded weights (columns: unit/label sketch z on components 0 and 1, its L on components 0 and
    1, the score check's rho). Per report: z = y0.w0 + y1.w1, l = y0.w2 + y1.w3, a = y0.w4 and
    u = y2.w4 (mod p): six multiplications per grid point. Returns (n, 4) columns (z, l, a, u)."""
    n, size, width = y.shape
    res = np.empty((n, 4), np.uint64)
    half = FOLD_EVERY // 2  # z and l take two products per grid point
    for k in range(n):
        zl = zh = ll = lh = al = ah = ul = uh = np.uint64(0)
        for i in range(size):
            y0 = y[k, i, 0]
            y1 = y[k, i, 1]
            zl, zh = _mac(zl, zh, y0, w[i, 0])
            zl, zh = _mac(zl, zh, y1, w[i, 1])
            ll, lh = _mac(ll, lh, y0, w[i, 2])
            ll, lh = _mac(ll, lh, y1, w[i, 3])
            al, ah = _mac(al, ah, y0, w[i, 4])
            ul, uh = _mac(ul, uh, y[k, i, 2], w[i, 4])
            if (i & (half - 1)) == half - 1:
                zl, zh, ll, lh = _fold128(zl, zh), np.uint64(0), _fold128(ll, lh), np.uint64(0)
                al, ah, ul, uh = _fold128(al, ah), np.uint64(0), _fold128(ul, uh), np.uint64(0)
        res[k, 0] = _fold128(zl, zh)
        res[k, 1] = _fold128(ll, lh)
        res[k, 2] = _fold128(al, ah)
        res[k, 3] = _fold128(ul, uh)
    return res
