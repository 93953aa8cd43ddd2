"""The fast backend: the fused AES-NI / VAES kernels of `_fused`, spread over all cores.

Same contract as the portable `fss.portable` (internal points, (width, n) outputs reduced mod
2^out_bits) and bit-identical results. Works group by group on `KeyBatch`'s grouped layout; the
padded lanes of the last group are evaluated and dropped.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from . import _cache
from ._aes import round_keys
from ._fused import eval_group, gen_group, trie_steps
from .keys import GROUP, KeyBatch, groups, payload_dtype, to_groups
from .params import TreeParams

MAX_WIDTH = 4  # wider payloads take the portable backend (the fused kernel unrolls over elements)


def _tag(width: int, has_v: bool, vaes: bool) -> str:
    """The compile-time choices of a kernel, naming its entries in the on-disk cache (`_cache`)."""
    return f"w{width}-{'dcf' if has_v else 'dpf'}-{'vaes' if vaes else 'aesni'}"


@functools.lru_cache(maxsize=None)
def _batch_kernel(width: int, has_v: bool, vaes: bool):
    group = eval_group(width, has_v, False, vaes)

    @njit(nogil=True, parallel=True)
    def kernel(seeds, cw_seed, cw_t, cw_v, xs, party, bits, mask, rk, out):
        for g in prange(seeds.shape[0]):
            group(seeds, cw_seed, cw_t, cw_v, xs, g, party, bits, mask, rk, out, g * GROUP)

    return _cache.cached(kernel, _tag(width, has_v, vaes))


@functools.lru_cache(maxsize=None)
def _sum_kernel(width: int, has_v: bool, vaes: bool):
    group = eval_group(width, has_v, True, vaes)

    @njit(nogil=True, parallel=True)
    def kernel(seeds, cw_seed, cw_t, cw_v, x, n, party, bits, mask, rk, partial):
        groups = seeds.shape[0]
        chunks = partial.shape[0]
        for c in prange(chunks):
            scratch = np.empty((width, GROUP), np.uint64)
            acc = np.zeros(width, np.uint64)
            for g in range(c * groups // chunks, (c + 1) * groups // chunks):
                group(seeds, cw_seed, cw_t, cw_v, x, g, party, bits, mask, rk, scratch, 0)
                lanes = min(GROUP, n - g * GROUP)  # the last group's padding is not counted
                for e in range(width):
                    for j in range(lanes):
                        acc[e] += scratch[e, j]
            partial[c] = acc

    return _cache.cached(kernel, _tag(width, has_v, vaes))


def _keys(batch: KeyBatch) -> tuple:
    return batch.seeds, batch.cw_seed, batch.cw_t, batch.cw_v


def eval_batch(batch: KeyBatch, xs: np.ndarray, vaes: bool) -> np.ndarray:
    p, n = batch.params, len(batch)
    padded = batch.seeds.shape[0] * GROUP
    out = np.empty((p.width, padded), np.uint64)
    if n:
        xp = np.zeros(padded, np.uint64)
        xp[:n] = xs
        kernel = _batch_kernel(p.width, p.level_payload, vaes)
        kernel(*_keys(batch), xp, batch.party, p.bits, np.uint64(p.mask), round_keys(), out)
    return out[:, :n]


OP_ONE, OP_BOTH, OP_LAST_ONE, OP_LAST_BOTH = 0, 1, 2, 3


@_cache.njit(nogil=True)
def trie_program(points, bits):
    """The depth-first walk over the union of the paths to `points` (sorted, unique), as rows
    (op, src slot, dst slot or d, second dst slot or left point, level, d or right point). A node at
    `level` lives in slot 2 level (on the current path) or 2 level + 1 (a right child waiting its
    turn). Steps at the last level turn their children into leaves at once (OP_LAST_*)."""
    m = points.shape[0]
    prog = np.empty((2 * m * (bits + 1), 6), np.int64)
    stack = np.empty((bits + 1, 4), np.int64)  # level, lo, hi, slot of pending right children
    ops, sp = 0, 0
    level, lo, hi, slot = 0, 0, m, 0
    while True:
        if level == bits:
            if sp == 0:
                break
            sp -= 1
            level, lo, hi, slot = stack[sp, 0], stack[sp, 1], stack[sp, 2], stack[sp, 3]
            continue
        shift = np.uint64(bits - 1 - level)
        a, z = lo, hi  # binary search: first point in [lo, hi) whose bit at this level is set
        while a < z:
            mid = (a + z) // 2
            if (points[mid] >> shift) & np.uint64(1):
                z = mid
            else:
                a = mid + 1
        nxt = 2 * (level + 1)
        if level == bits - 1:  # children are leaves: points lo (and lo + 1 if both)
            if a == lo or a == hi:
                prog[ops] = (OP_LAST_ONE, slot, 1 if a == lo else 0, lo, level, 0)
            else:
                prog[ops] = (OP_LAST_BOTH, slot, 0, lo, level, a)
            ops += 1
            level = bits
            continue
        if a == lo or a == hi:
            prog[ops] = (OP_ONE, slot, nxt, 0, level, 1 if a == lo else 0)
        else:
            prog[ops] = (OP_BOTH, slot, nxt, nxt + 1, level, 0)
            stack[sp, 0], stack[sp, 1], stack[sp, 2], stack[sp, 3] = level + 1, a, hi, nxt + 1
            sp += 1
            hi = a
        ops += 1
        slot = nxt
        level += 1
    return prog[:ops]


@functools.lru_cache(maxsize=None)
def _trie_kernel(width: int, has_v: bool, vaes: bool):
    step_one, step_both, last_one, last_both = trie_steps(width, has_v, vaes)

    @njit(nogil=True, parallel=True)
    def kernel(seeds, cw_seed, cw_t, cw_v, prog, n, party, bits, mask, rk, partial):
        groups = seeds.shape[0]
        chunks = partial.shape[0]
        for c in prange(chunks):
            state = np.zeros((2 * (bits + 1), 3 + width, GROUP), np.uint64)
            row = partial[c]
            for g in range(c * groups // chunks, (c + 1) * groups // chunks):
                lanes = min(GROUP, n - g * GROUP)  # the last group's padding is not counted
                state[0, 0] = seeds[g, 0]
                state[0, 1] = seeds[g, 1]
                state[0, 2] = party
                state[0, 3:] = 0
                for r in range(prog.shape[0]):
                    op, src, a1, a2, level, a3 = prog[r]
                    if op == 0:  # child a3 of src into slot a1
                        step_one(state, src, a1, 0, a3, level, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, row)
                    elif op == 1:  # both children into slots a1, a2
                        step_both(state, src, a1, a2, 0, level, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, row)
                    elif op == 2:  # last level: child a1 is the leaf of point a2
                        last_one(state, src, a2, 0, a1, lanes, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, row)
                    else:  # last level: both children, points a2 and a3
                        last_both(state, src, a2, a3, 0, lanes, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, row)

    return _cache.cached(kernel, _tag(width, has_v, vaes))


def eval_sum(batch: KeyBatch, points: np.ndarray, vaes: bool, threads: int) -> np.ndarray:
    """(m, width) sums. One point: one fused pass over the keys. Several: each group of keys walks
    its trees once over the union of the points' paths (a full grid of 2^b points costs about
    2^(b+1) node expansions per key, not b * 2^b)."""
    p, n = batch.params, len(batch)
    sums = np.zeros((points.shape[0], p.width), np.uint64)
    if not n or not points.shape[0]:
        return sums
    chunks = max(1, min(batch.seeds.shape[0], 4 * threads))
    common = (n, batch.party, p.bits, np.uint64(p.mask), round_keys())
    if points.shape[0] == 1:
        partial = np.empty((chunks, p.width), np.uint64)
        _sum_kernel(p.width, p.level_payload, vaes)(*_keys(batch), points, *common, partial)
        return partial.sum(axis=0, dtype=np.uint64, keepdims=True) & np.uint64(p.mask)
    unique, inverse = np.unique(points, return_inverse=True)
    partial = np.zeros((chunks, unique.shape[0], p.width), np.uint64)
    prog = trie_program(unique, p.bits)
    _trie_kernel(p.width, p.level_payload, vaes)(*_keys(batch), prog, *common, partial)
    return partial.sum(axis=0, dtype=np.uint64)[inverse.reshape(-1)] & np.uint64(p.mask)


@functools.lru_cache(maxsize=None)
def _gen_kernel(width: int, has_v: bool, vaes: bool):
    group = gen_group(width, has_v, vaes)

    @njit(nogil=True, parallel=True)
    def kernel(alphas, betas, roots, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v):
        for g in prange(cw_seed.shape[0]):
            group(alphas, betas, roots, g, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v)

    return _cache.cached(kernel, _tag(width, has_v, vaes))


def gen_batch(p: TreeParams, alphas: np.ndarray, betas: np.ndarray, roots: np.ndarray, vaes: bool) -> tuple[KeyBatch, KeyBatch]:
    """Same contract as `portable.gen_batch`, writing the grouped arrays directly."""
    n, w = alphas.shape[0], p.width
    G = groups(n)
    pad = lambda a: np.concatenate([a, np.zeros(a.shape[:-1] + (G * GROUP - n,), a.dtype)], axis=-1)  # noqa: E731
    cw_seed = np.empty((G, p.bits, 2, GROUP), np.uint64)
    cw_t = np.empty((G, p.bits, GROUP), np.uint8)
    cw_v = np.empty((G, p.v_levels, w, GROUP), payload_dtype(p))
    if n:
        ones = np.uint64(2**64 - 1)
        below = ones if p.beta_below else np.uint64(0)
        equal = ones if p.beta_equal else np.uint64(0)
        kernel = _gen_kernel(w, p.level_payload, vaes)
        kernel(pad(alphas), pad(betas), pad(roots), p.bits, np.uint64(p.mask), below, equal, round_keys(), cw_seed, cw_t, cw_v)
    k0 = KeyBatch(p, 0, n, to_groups(roots[0]), cw_seed, cw_t, cw_v)
    return k0, KeyBatch(p, 1, n, to_groups(roots[1]), cw_seed, cw_t, cw_v)
