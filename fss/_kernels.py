"""numba kernels of the portable backend: the per-level bookkeeping around one AES ECB call.

Private. The callers in `fss.tree` validate shapes and dtypes; these trust their inputs, never
raise, and do all arithmetic in uint64 (wrapping mod 2^64; masks to 2^out_bits are applied by the
caller, which is exact because 2^out_bits divides 2^64).

Layouts (n keys): seeds (n, 2) words; blocks (..., nb, 2) words; payload vectors (n, width).
"""
from __future__ import annotations

import numpy as np
from numba import njit

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_NOT1 = ~np.uint64(1)


@njit(cache=True, nogil=True)
def fill_tweaked(s, roles, buf):
    """buf[k, j] = s[k] xor T(roles[k], j) for every key k and block j (the PRG inputs)."""
    n, nb = buf.shape[0], buf.shape[1]
    for k in range(n):
        lo, hi = s[k, 0], s[k, 1] ^ roles[k]
        for j in range(nb):
            buf[k, j, 0] = lo ^ np.uint64(j)
            buf[k, j, 1] = hi


@njit(cache=True, nogil=True)
def fill_tweaked_both(s, buf):
    """buf[k, side, j] = s[k] xor T(LEFT + side, j): both children of each seed (gen, full eval)."""
    n, nb = buf.shape[0], buf.shape[2]
    for k in range(n):
        for side in range(2):
            hi = s[k, 1] ^ np.uint64(1 + side)
            for j in range(nb):
                buf[k, side, j, 0] = s[k, 0] ^ np.uint64(j)
                buf[k, side, j, 1] = hi


@njit(cache=True, nogil=True)
def eval_level(out, s, t, acc, cw_seed, cw_t, cw_v, d, negate, has_v):
    """One tree level for n keys, each walking to child d[k]; out[k] holds that child's PRG blocks.
    Updates seeds s, control bits t and (DCF) the accumulated payload shares acc in place."""
    n, w = acc.shape[0], acc.shape[1]
    for k in range(n):
        tk = t[k]
        lo = out[k, 0, 0]
        hi = out[k, 0, 1]
        tn = np.uint8(lo & _U1)
        lo &= _NOT1
        if tk:
            lo ^= cw_seed[k, 0]
            hi ^= cw_seed[k, 1]
            tn ^= (cw_t[k] >> d[k]) & np.uint8(1)
        if has_v:
            for e in range(w):
                v = out[k, 1 + e // 2, e % 2]
                if tk:
                    v += cw_v[k, e]
                if negate:
                    acc[k, e] -= v
                else:
                    acc[k, e] += v
        s[k, 0] = lo
        s[k, 1] = hi
        t[k] = tn


@njit(cache=True, nogil=True)
def add_leaf(acc, conv, t, cw_last, negate):
    """acc += (-1)^party * (Convert(s) + t * CW_{n+1}) for every key."""
    n, w = acc.shape[0], acc.shape[1]
    for k in range(n):
        for e in range(w):
            v = conv[k, e]
            if t[k]:
                v += cw_last[k, e]
            if negate:
                acc[k, e] -= v
            else:
                acc[k, e] += v


@njit(cache=True, nogil=True)
def gen_level(out, s, t, v_alpha, a_bits, below, cw_seed, cw_t, cw_v, has_v):
    """One level of Gen for n key pairs (BCG+21 Fig. 1, step 4). out[b, k, side] holds the PRG blocks
    of party b's seed for key k and child `side`. Writes this level's correction words and advances
    both parties' seeds and control bits along alpha's path, in place."""
    n, w = v_alpha.shape[0], v_alpha.shape[1]
    for k in range(n):
        keep = np.int64(a_bits[k])
        lose = 1 - keep
        s_lo = out[0, k, lose, 0, 0] ^ out[1, k, lose, 0, 0]
        s_hi = out[0, k, lose, 0, 1] ^ out[1, k, lose, 0, 1]
        s_lo &= _NOT1
        t_l = np.uint8((out[0, k, 0, 0, 0] ^ out[1, k, 0, 0, 0]) & _U1) ^ np.uint8(keep) ^ np.uint8(1)
        t_r = np.uint8((out[0, k, 1, 0, 0] ^ out[1, k, 1, 0, 0]) & _U1) ^ np.uint8(keep)
        cw_seed[k, 0] = s_lo
        cw_seed[k, 1] = s_hi
        cw_t[k] = t_l | (t_r << np.uint8(1))
        t_keep = t_r if keep else t_l
        t1 = t[1, k]
        if has_v:
            for e in range(w):
                blk, word = 1 + e // 2, e % 2
                vcw = out[1, k, lose, blk, word] - out[0, k, lose, blk, word] - v_alpha[k, e]
                if lose == 0:
                    vcw += below[k, e]
                if t1:
                    vcw = _U0 - vcw
                cw_v[k, e] = vcw
                signed_cw = _U0 - vcw if t1 else vcw
                v_alpha[k, e] += out[0, k, keep, blk, word] - out[1, k, keep, blk, word] + signed_cw
        for b in range(2):
            lo = out[b, k, keep, 0, 0]
            hi = out[b, k, keep, 0, 1]
            tn = np.uint8(lo & _U1)
            lo &= _NOT1
            if t[b, k]:
                lo ^= s_lo
                hi ^= s_hi
                tn ^= t_keep
            s[b, k, 0] = lo
            s[b, k, 1] = hi
            t[b, k] = tn


@njit(cache=True, nogil=True)
def gen_leaf(conv0, conv1, t1, v_alpha, equal, cw_last):
    """Final correction word (BCG+21 Fig. 1, step 5, with beta added on x == alpha when `equal`)."""
    n, w = v_alpha.shape[0], v_alpha.shape[1]
    for k in range(n):
        for e in range(w):
            c = conv1[k, e] - conv0[k, e] - v_alpha[k, e] + equal[k, e]
            cw_last[k, e] = _U0 - c if t1[k] else c


@njit(cache=True, nogil=True)
def full_level(out, s, t, cw_seed, cw_t, s_next, t_next):
    """Expand every node of one level of a single key's tree into both children (full-domain eval)."""
    n = s.shape[0]
    for k in range(n):
        for side in range(2):
            lo = out[k, side, 0, 0]
            hi = out[k, side, 0, 1]
            tn = np.uint8(lo & _U1)
            lo &= _NOT1
            if t[k]:
                lo ^= cw_seed[0]
                hi ^= cw_seed[1]
                tn ^= (cw_t >> np.uint8(side)) & np.uint8(1)
            s_next[2 * k + side, 0] = lo
            s_next[2 * k + side, 1] = hi
            t_next[2 * k + side] = tn


@njit(cache=True, nogil=True)
def sum_rows(values, mask):
    """Sum over axis 0 of an (n, w) uint64 array, mod 2^64, then masked."""
    w = values.shape[1]
    total = np.zeros(w, dtype=np.uint64)
    for k in range(values.shape[0]):
        for e in range(w):
            total[e] += values[k, e]
    for e in range(w):
        total[e] &= mask
    return total
