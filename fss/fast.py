"""The fast backend: the fused AES-NI / VAES kernels of `_fused`, spread over all cores.

Same contract as the portable `fss.tree` (internal points, (width, n) outputs reduced mod
2^out_bits) and bit-identical results. Works group by group on `KeyBatch`'s grouped layout; the
padded lanes of the last group are evaluated and dropped.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from ._aes import round_keys
from ._fused import GROUP, eval_group, gen_group
from .keys import KeyBatch, groups, payload_dtype, to_groups
from .params import TreeParams

MAX_WIDTH = 4  # wider payloads take the portable backend (the fused kernel unrolls over elements)


@functools.lru_cache(maxsize=None)
def _batch_kernel(width: int, has_v: bool, vaes: bool):
    group = eval_group(width, has_v, False, vaes)

    @njit(nogil=True, parallel=True)
    def kernel(seeds, cw_seed, cw_t, cw_v, xs, party, bits, mask, rk, out):
        for g in prange(seeds.shape[0]):
            group(seeds, cw_seed, cw_t, cw_v, xs, g, party, bits, mask, rk, out, g * 16)

    return kernel


@functools.lru_cache(maxsize=None)
def _sum_kernel(width: int, has_v: bool, vaes: bool):
    group = eval_group(width, has_v, True, vaes)

    @njit(nogil=True, parallel=True)
    def kernel(seeds, cw_seed, cw_t, cw_v, x, n, party, bits, mask, rk, partial):
        groups = seeds.shape[0]
        chunks = partial.shape[0]
        for c in prange(chunks):
            scratch = np.empty((width, 16), np.uint64)
            acc = np.zeros(width, np.uint64)
            for g in range(c * groups // chunks, (c + 1) * groups // chunks):
                group(seeds, cw_seed, cw_t, cw_v, x, g, party, bits, mask, rk, scratch, 0)
                lanes = min(16, n - g * 16)  # the last group's padding is not counted
                for e in range(width):
                    for j in range(lanes):
                        acc[e] += scratch[e, j]
            partial[c] = acc

    return kernel


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


def eval_sum(batch: KeyBatch, points: np.ndarray, vaes: bool, threads: int) -> np.ndarray:
    """(m, width) sums; each point is one pass over the keys with per-chunk partial sums."""
    p, n = batch.params, len(batch)
    sums = np.zeros((points.shape[0], p.width), np.uint64)
    if not n:
        return sums
    kernel = _sum_kernel(p.width, p.level_payload, vaes)
    chunks = max(1, min(batch.seeds.shape[0], 4 * threads))
    partial = np.empty((chunks, p.width), np.uint64)
    for j, x in enumerate(points):
        kernel(*_keys(batch), np.array([x], np.uint64), n, batch.party, p.bits, np.uint64(p.mask), round_keys(), partial)
        sums[j] = partial.sum(axis=0, dtype=np.uint64)
    return sums & np.uint64(p.mask)


@functools.lru_cache(maxsize=None)
def _gen_kernel(width: int, has_v: bool, vaes: bool):
    group = gen_group(width, has_v, vaes)

    @njit(nogil=True, parallel=True)
    def kernel(alphas, betas, roots, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v):
        for g in prange(cw_seed.shape[0]):
            group(alphas, betas, roots, g, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v)

    return kernel


def gen_batch(p: TreeParams, alphas: np.ndarray, betas: np.ndarray, roots: np.ndarray, vaes: bool) -> tuple[KeyBatch, KeyBatch]:
    """Same contract as `tree.gen_batch`, writing the grouped arrays directly."""
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
