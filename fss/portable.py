"""Batch gen and eval of the shared tree walk (DPF and DCF), level by level: the portable backend.

Each level costs one pycryptodome ECB call over every key's PRG blocks (`prg.mmo_blocks`) and one
numba kernel for the bookkeeping (`_kernels`). Inputs here are already validated and mapped to the
internal domain (x xor c, see `TreeParams.input_xor`); payloads are (width, n) uint64 reduced mod
2^out_bits. It needs no AES instructions of its own.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import _kernels as K
from .keys import KeyBatch, to_groups
from .params import TreeParams
from .prg import mmo_blocks


def _level_bits(values: np.ndarray, p: TreeParams, level: int) -> np.ndarray:
    """Bit `level` (0 = most significant of `bits`) of every value, as uint8."""
    return ((values >> np.uint64(p.bits - 1 - level)) & np.uint64(1)).astype(np.uint8)


def _mmo(fill, *args, shape) -> np.ndarray:
    inp = np.empty(shape + (2,), np.uint64)
    fill(*args, inp)
    out = np.empty_like(inp)
    mmo_blocks(inp, out)
    return out


def convert(p: TreeParams, s: np.ndarray) -> np.ndarray:
    """Leaf seeds (2, n) -> payloads (width, n): the high word for width 1, else LEAF blocks."""
    n = s.shape[1]
    if p.width == 1:
        return s[1:2].copy()
    out = _mmo(K.fill_leaf, s, shape=(n, p.value_blocks))
    return np.ascontiguousarray(out.reshape(n, 2 * p.value_blocks)[:, : p.width].T)


def gen_batch(p: TreeParams, alphas: np.ndarray, betas: np.ndarray, roots: np.ndarray) -> tuple[KeyBatch, KeyBatch]:
    """Key pairs for internal alphas (n,) and payloads (width, n); roots (2, 2, n): both parties'
    root seeds as (lo, hi) rows. Deterministic: all randomness is in `roots`."""
    n, w = alphas.shape[0], p.width
    s = roots.copy()  # (party, word, key); the walk updates it in place
    t = np.zeros((2, n), np.uint8)
    t[1] = 1
    zeros = np.zeros((w, n), np.uint64)
    below = betas if p.beta_below else zeros
    equal = betas if p.beta_equal else zeros
    v_alpha = np.zeros((w, n), np.uint64)
    cw_seed = np.empty((p.bits, 2, n), np.uint64)
    cw_t = np.empty((p.bits, n), np.uint8)
    cw_v = np.zeros((p.v_levels, w, n), np.uint64)
    nb = p.expand_blocks
    for i in range(p.bits):
        out = np.stack([_mmo(K.fill_expand, s[b], shape=(n, nb)) for b in (0, 1)])
        level_v = cw_v[i] if p.level_payload else cw_v[0]
        K.gen_level(out, s, t, v_alpha, _level_bits(alphas, p, i), below, cw_seed[i], cw_t[i], level_v, p.level_payload)
    K.gen_leaf(convert(p, s[0]), convert(p, s[1]), t[1], v_alpha, equal, cw_v[-1])
    cw_v &= np.uint64(p.mask)
    k0 = KeyBatch.from_logical(p, 0, roots[0], cw_seed, cw_t, cw_v)
    return k0, dataclasses.replace(k0, party=1, seeds=to_groups(roots[1]))


def eval_batch(batch: KeyBatch, xs: np.ndarray) -> np.ndarray:
    """Shares (width, n) of key k at internal point xs[k], reduced mod 2^out_bits."""
    p, n = batch.params, len(batch)
    s = np.moveaxis(batch.seeds, 0, 1).reshape(2, -1)[:, :n].copy()  # a copy: the walk updates it in place
    t = np.full(n, batch.party, np.uint8)
    acc = np.zeros((p.width, n), np.uint64)
    for i in range(p.bits):
        d = _level_bits(xs, p, i)
        out = _mmo(K.fill_eval, s, d, p.width, shape=(n, p.eval_blocks))
        level_v = batch.cw_v[:, i] if p.level_payload else batch.cw_v[:, 0]
        K.eval_level(out, s, t, acc, batch.cw_seed[:, i], batch.cw_t[:, i], level_v, d, p.level_payload)
    K.finish_eval(acc, convert(p, s), t, batch.cw_v[:, -1], batch.party == 1)
    acc &= np.uint64(p.mask)
    return acc


def eval_sum(batch: KeyBatch, points: np.ndarray) -> np.ndarray:
    """Sum over all keys of the shares at each internal point: (m, width), mod 2^out_bits."""
    p, n = batch.params, len(batch)
    sums = np.zeros((points.shape[0], p.width), np.uint64)
    for j, x in enumerate(points):
        if n:
            sums[j] = K.sum_columns(eval_batch(batch, np.full(n, x, np.uint64)), np.uint64(p.mask))
    return sums


def eval_full(batch: KeyBatch) -> np.ndarray:
    """Shares (width, 2^bits) of a single DPF key at every internal point, in internal order."""
    p = batch.params
    seeds, cw_seed, cw_t, cw_v = batch.logical()
    s = seeds
    t = np.full(1, batch.party, np.uint8)
    for i in range(p.bits):
        m = s.shape[1]
        out = _mmo(K.fill_expand, s, shape=(m, 2))
        s_next = np.empty((2, 2 * m), np.uint64)
        t_next = np.empty(2 * m, np.uint8)
        K.full_level(out, s, t, cw_seed[i, 0, 0], cw_seed[i, 1, 0], cw_t[i, 0], s_next, t_next)
        s, t = s_next, t_next
    acc = np.zeros((p.width, s.shape[1]), np.uint64)
    cw_last = to_groups(np.ascontiguousarray(np.broadcast_to(cw_v[-1], acc.shape)))
    K.finish_eval(acc, convert(p, s), t, cw_last, batch.party == 1)
    acc &= np.uint64(p.mask)
    return acc
