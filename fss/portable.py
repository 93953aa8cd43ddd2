"""Batch gen and eval of the shared tree walk (DPF and DCF), level by level: the portable backend.

Each level costs one pycryptodome ECB call over every key's PRG blocks (`prg.mmo_blocks`) and one
numba kernel for the bookkeeping (`_kernels`). Inputs here are already validated and mapped to the
internal domain (x xor c, see `TreeParams.input_xor`); payloads are (width, n) uint64 reduced mod
2^out_bits. It needs no AES instructions of its own.

Prime-field keys (`TreeParams.prime`, F_p with p = 2^61 - 1) walk the tree with the same kernels
(seeds and control bits: `has_v=False`) and do the payload arithmetic here in numpy with `fss.field`;
each payload element is a whole PRG block reduced mod p (key format version 1) or a word's low 61
bits, rejection-sampled (version 2; `fss.prg`, "Prime-field payloads"; see `fss.reference`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import _kernels as K
from . import field as F
from .keys import GROUP, KeyBatch, from_groups, to_groups
from .params import TreeParams
from .prg import M61, ROLE_LEAF, ROLE_SEED, ROLE_VALUE, EcbPass, ecb_pointers, mmo_blocks, resample, source

_NOT1 = ~np.uint64(1)
_M61 = np.uint64(M61)


def _elements(words: np.ndarray, lo: np.ndarray, hi: np.ndarray, role: int, index: object) -> np.ndarray:
    """F_p elements of 64-bit PRG words (key format version 2, `prg.element`): the low 61 bits, and
    where those are p (probability 2^-61 each) `prg.resample` of the expanded seed (lo, hi) at
    source (role, index); lo, hi and index broadcast against words."""
    x = words & _M61
    bad = np.nonzero(x == _M61)
    if bad[0].size:
        lo, hi, index = (np.broadcast_to(a, x.shape) for a in (lo, hi, np.asarray(index, np.int64)))
        for at in zip(*bad):
            x[at] = resample(int(lo[at]) | int(hi[at]) << 64, source(role, int(index[at])))
    return x


def _seed_words(s: np.ndarray, width: int) -> np.ndarray:
    """Leaf seeds (2, n) -> payloads (width, n) for width 1, 2 over F_p version 2: word e of each
    seed shifted right by one bit (`prg.seed_word`), rejection-sampled."""
    w0 = (s[0] >> np.uint64(1)) | (s[1] << np.uint64(63))
    w1 = (s[0] >> np.uint64(62)) | (s[1] << np.uint64(2))
    words = np.stack([w0, w1][:width])
    return _elements(words, s[0], s[1], ROLE_SEED, np.arange(width)[:, None])


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
    if p.block_elements:
        if p.width == 1:  # the seed without its control bit (127 bits), mod p
            return F.reduce128((s[0] >> np.uint64(1)) | (s[1] << np.uint64(63)), s[1] >> np.uint64(1))[None, :]
        out = _mmo(K.fill_leaf, s, shape=(n, p.width))  # LEAF block e for element e
        return np.ascontiguousarray(F.reduce128(out[..., 0], out[..., 1]).T)
    if p.prime and p.seed_leaf:
        return _seed_words(s, p.width)
    if p.prime:
        out = _mmo(K.fill_leaf, s, shape=(n, p.value_blocks))
        words = np.ascontiguousarray(out.reshape(n, 2 * p.value_blocks)[:, : p.width].T)
        return _elements(words, s[0], s[1], ROLE_LEAF, np.arange(p.width)[:, None])
    if p.width == 1:
        return s[1:2].copy()
    out = _mmo(K.fill_leaf, s, shape=(n, p.value_blocks))
    return np.ascontiguousarray(out.reshape(n, 2 * p.value_blocks)[:, : p.width].T)


def gen_batch(p: TreeParams, alphas: np.ndarray, betas: np.ndarray, roots: np.ndarray) -> tuple[KeyBatch, KeyBatch]:
    """Key pairs for internal alphas (n,) and payloads (width, n); roots (2, 2, n): both parties'
    root seeds as (lo, hi) rows. Deterministic: all randomness is in `roots`. Keys are made a chunk
    of CHUNK_GROUPS * GROUP at a time (each level's blocks stay in the cache)."""
    n, chunk = alphas.shape[0], CHUNK_GROUPS * GROUP
    if n <= chunk:
        cw_seed, cw_t, cw_v = _gen_logical(p, alphas, betas, roots)
    else:
        parts = [_gen_logical(p, alphas[c : c + chunk], np.ascontiguousarray(betas[:, c : c + chunk]), roots[:, :, c : c + chunk])
                 for c in range(0, n, chunk)]
        cw_seed, cw_t, cw_v = (np.concatenate([q[j] for q in parts], axis=-1) for j in range(3))
    k0 = KeyBatch.from_logical(p, 0, roots[0], cw_seed, cw_t, cw_v)
    return k0, dataclasses.replace(k0, party=1, seeds=to_groups(roots[1]))


def _gen_logical(p: TreeParams, alphas: np.ndarray, betas: np.ndarray, roots: np.ndarray) -> tuple:
    """`gen_batch`'s correction words as logical arrays (bits, 2, n), (bits, n), (v_levels, width, n)."""
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
        a_bits = _level_bits(alphas, p, i)
        if p.prime and p.level_payload:
            _gen_payload_prime(p, out, s, t[1], v_alpha, a_bits, below, level_v)  # before s and t change
        K.gen_level(out, s, t, v_alpha, a_bits, below, cw_seed[i], cw_t[i], level_v, p.level_payload and not p.prime)
    if p.prime:
        c = F.add(F.sub(F.sub(convert(p, s[1]), convert(p, s[0])), v_alpha), equal)
        cw_v[-1] = _pick(_mask(t[1]), F.neg(c), c)
    else:
        K.gen_leaf(convert(p, s[0]), convert(p, s[1]), t[1], v_alpha, equal, cw_v[-1])
        cw_v &= np.uint64(p.mask)
    return cw_seed, cw_t, cw_v


def _values(p: TreeParams, out: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Both children's payload elements over F_p from the blocks `fill_expand` gave for seeds s (2, m):
    out (m, expand_blocks, 2) -> (m, 2 width), element side*width + e."""
    m = out.shape[0]
    if p.block_elements:  # VALUE block side*width + e, reduced mod p
        return F.reduce128(out[:, 2:, 0], out[:, 2:, 1])
    return _elements(out[:, 2:, :].reshape(m, 2 * p.width), s[0][:, None], s[1][:, None], ROLE_VALUE, np.arange(2 * p.width))


def _gen_payload_prime(p, out, s, t1, v_alpha, a_bits, below, cw_out) -> None:
    """One level's payload correction over F_p (BCG+21 Fig. 1, step 4; as `_kernels.gen_level`):
    writes cw_out (width, n) and advances v_alpha in place. out (2, n, expand_blocks, 2): both parties'
    blocks of their seeds s (2, 2, n)."""
    n, w = a_bits.shape[0], p.width
    vals = np.stack([_values(p, out[b], s[b]) for b in (0, 1)]).reshape(2, n, 2, w).transpose(0, 2, 3, 1)  # (b, side, e, k)
    keep = _mask(a_bits)  # selections by masks, as `_kernels.gen_level`: no data-dependent branch
    v_keep = _pick(keep, vals[:, 1], vals[:, 0])
    v_lose = _pick(keep, vals[:, 0], vals[:, 1])
    vcw = F.sub(F.sub(v_lose[1], v_lose[0]), v_alpha)
    vcw = F.add(vcw, below & keep)  # beta on the left (lost) child: x < alpha
    cw_out[...] = _pick(_mask(t1), F.neg(vcw), vcw)
    v_alpha[...] = F.add(F.sub(F.add(v_alpha, v_keep[0]), v_keep[1]), vcw)


def _mask(bits: np.ndarray) -> np.ndarray:
    """0/1 values -> uint64 masks: all ones where 1."""
    return np.uint64(0) - (bits.astype(np.uint64) & np.uint64(1))


def _pick(mask: np.ndarray, one: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """`one` where `mask` is all ones, `zero` where 0 (elementwise and, or: no data-dependent branch)."""
    return (one & mask) | (zero & ~mask)


def _eval_batch_prime(batch: KeyBatch, xs: np.ndarray) -> np.ndarray:
    """`eval_batch` over F_p: the kernels walk seeds and control bits, numpy adds the payloads."""
    p, n = batch.params, len(batch)
    s = np.moveaxis(batch.seeds, 0, 1).reshape(2, -1)[:, :n].copy()
    t = np.full(n, batch.party, np.uint8)
    acc = np.zeros((p.width, n), np.uint64)
    cw_v = from_groups(batch.cw_v, n).astype(np.uint64)  # (v_levels, width, n)
    words = p.width * p.words_per_element
    for i in range(p.bits):
        d = _level_bits(xs, p, i)
        out = _mmo(K.fill_eval, s, d, words, shape=(n, p.eval_blocks))  # child d's payload: word d*words on
        t_old, s_old = t.astype(bool), s.copy()
        K.eval_level(out, s, t, acc, batch.cw_seed[:, i], batch.cw_t[:, i], batch.cw_v[:, 0], d, False)
        if p.level_payload:
            if p.block_elements:
                v = F.reduce128(out[:, 1:, 0], out[:, 1:, 1]).T
            else:  # child d's elements start at word (d * width) mod 2 of its first block
                at = (d.astype(np.int64) * p.width) % 2
                flat = out[:, 1:, :].reshape(n, -1)
                v = flat[np.arange(n)[None, :], at[None, :] + np.arange(p.width)[:, None]]
                v = _elements(v, s_old[0], s_old[1], ROLE_VALUE, d.astype(np.int64) * p.width + np.arange(p.width)[:, None])
            acc = F.add(acc, F.add(v, np.where(t_old, cw_v[i], np.uint64(0))))
    return _finish_prime(acc, convert(p, s), t, cw_v[-1], batch.party)


def _finish_prime(acc, conv, t, cw_last, party) -> np.ndarray:
    """(-1)^party * (acc + Convert(s) + t * CW_{n+1}) over F_p."""
    v = F.add(F.add(acc, conv), np.where(t.astype(bool), cw_last, np.uint64(0)))
    return F.neg(v) if party == 1 else v


FUSED_LOOP = True  # eval_batch's level loop in one numba call (`fss._ecbwalk`) when pycryptodome allows it
WALK_GROUPS = 256  # groups the fused loop walks together
CHUNK_GROUPS = 256  # keys walk the levels 256 groups (4096 keys) at a time: a level's PRG blocks stay in cache


def eval_batch(batch: KeyBatch, xs: np.ndarray) -> np.ndarray:
    """Shares (width, n) of key k at internal point xs[k], reduced mod 2^out_bits. The keys go
    through the levels a chunk of `CHUNK_GROUPS` groups at a time (each level's ECB input and output
    stay in the cache instead of streaming fresh pages through memory)."""
    p, n = batch.params, len(batch)
    if p.prime:
        return _eval_batch_prime(batch, xs)
    acc = np.zeros((p.width, n), np.uint64)
    ptrs = ecb_pointers() if FUSED_LOOP else None
    if ptrs is not None and n:
        from ._ecbwalk import eval_chunks

        vb = p.value_blocks if p.width > 1 else 0
        st = eval_chunks(np.uint64(ptrs[0]), np.uint64(ptrs[1]), batch.seeds, batch.party, np.ascontiguousarray(xs, np.uint64),
                         batch.cw_seed, batch.cw_t, batch.cw_v, p.width, p.eval_blocks, vb, p.level_payload, WALK_GROUPS, acc)
        if st:
            raise RuntimeError(f"pycryptodome's ECB_encrypt failed ({st})")
        acc &= np.uint64(p.mask)
        return acc
    G = batch.seeds.shape[0]
    for g0 in range(0, G, CHUNK_GROUPS):
        g1 = min(G, g0 + CHUNK_GROUPS)
        k0, k1 = g0 * GROUP, min(n, g1 * GROUP)
        m, mp = k1 - k0, (g1 - g0) * GROUP  # keys, and lanes with the last group's padding
        s = np.moveaxis(batch.seeds[g0:g1], 0, 1).reshape(2, mp).copy()  # a copy: the walk updates it in place
        t = np.full(mp, batch.party, np.uint8)
        part = np.zeros((p.width, mp), np.uint64)
        x = np.zeros(mp, np.uint64)
        x[:m] = xs[k0:k1]
        inp = np.empty((mp, p.eval_blocks, 2), np.uint64)
        out = np.empty_like(inp)
        ecb = EcbPass(inp, out)
        K.fill_eval_at(s, x, p.bits - 1, p.width, inp)
        w1 = p.width == 1 and p.level_payload
        for i in range(p.bits):
            ecb()  # AES only: the step xors the input back in (MMO)
            # this level's children, and the next level's blocks written over inp (the last: the seeds to s)
            if w1:
                K.eval_step_w1(out, inp, s, t, part, batch.cw_seed, batch.cw_t, batch.cw_v, g0, i, x, p.bits - 1 - i, i == p.bits - 1)
            else:
                K.eval_step_at(out, inp, s, t, part, batch.cw_seed, batch.cw_t, batch.cw_v, g0, i, i if p.level_payload else 0,
                               x, p.bits - 1 - i, p.width, p.level_payload, i == p.bits - 1)
        K.finish_eval(part, convert(p, s), t, batch.cw_v[g0:g1, -1], batch.party == 1)
        acc[:, k0:k1] = part[:, :m]
    acc &= np.uint64(p.mask)
    return acc


def eval_sum(batch: KeyBatch, points: np.ndarray) -> np.ndarray:
    """Sum over all keys of the shares at each internal point: (m, width), mod 2^out_bits."""
    p, n = batch.params, len(batch)
    sums = np.zeros((points.shape[0], p.width), np.uint64)
    for j, x in enumerate(points):
        if n and p.prime:
            sums[j] = F.sum(eval_batch(batch, np.full(n, x, np.uint64)), axis=1)
        elif n:
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
    if p.prime:
        cw_last = np.broadcast_to(cw_v[-1].astype(np.uint64), (p.width, s.shape[1]))
        return _finish_prime(np.zeros((p.width, s.shape[1]), np.uint64), convert(p, s), t, cw_last, batch.party)
    acc = np.zeros((p.width, s.shape[1]), np.uint64)
    cw_last = to_groups(np.ascontiguousarray(np.broadcast_to(cw_v[-1], acc.shape)))
    K.finish_eval(acc, convert(p, s), t, cw_last, batch.party == 1)
    acc &= np.uint64(p.mask)
    return acc


def grid_chunk(p: TreeParams, size: int) -> int:
    """Keys per pass of the portable `eval_grid`: about 2^17 tree nodes a level at most."""
    return max(1, (1 << 17) // size)


def eval_grid(batch: KeyBatch, start: int, size: int, reverse: bool) -> np.ndarray:
    """Shares (n, size, width) of every key at the internal points start .. start + size - 1
    (start + size <= 2^bits): entry j is point start + j, or with `reverse` point start + size - 1 - j.
    Level by level over all keys' nodes: level i holds the prefixes of the range's points, each
    expanded into both children (`fill_expand`: LEFT, RIGHT, VALUE blocks), and the children outside
    the range's prefixes dropped (at most one at each end)."""
    p, n, w = batch.params, len(batch), batch.params.width
    out = np.empty((n, size, w), np.uint64)
    seeds, cw_seed, cw_t, cw_v = batch.logical()
    cw_v = cw_v.astype(np.uint64)
    step = grid_chunk(p, size)
    for k in range(0, n, step):
        ks = slice(k, min(n, k + step))
        part = _grid_keys(p, batch.party, seeds[:, ks], cw_seed[..., ks], cw_t[:, ks], cw_v[..., ks], start, size)
        out[ks] = part[:, ::-1] if reverse else part
    return out


def _grid_keys(p: TreeParams, party: int, seeds, cw_seed, cw_t, cw_v, start: int, size: int) -> np.ndarray:
    """`eval_grid` for the keys of the logical arrays given (n keys): (n, size, width), internal order."""
    n, w, bits = seeds.shape[1], p.width, p.bits
    last = start + size - 1
    s = seeds.reshape(2, n, 1).copy()  # (word, key, node)
    t = np.full((n, 1), party, np.uint8)
    acc = np.zeros((w, n, 1), np.uint64)
    nb = p.expand_blocks
    for i in range(bits):
        m = s.shape[2]
        out = _mmo(K.fill_expand, s.reshape(2, n * m), shape=(n * m, nb)).reshape(n, m, nb, 2)
        tm = np.uint64(0) - t.astype(np.uint64)  # all ones where t
        kid_s, kid_t, kid_acc = [], [], []
        if p.prime and p.level_payload:  # both children's elements (`_values`)
            vals = _values(p, out.reshape(n * m, nb, 2), s.reshape(2, n * m)).reshape(n, m, 2 * w)
        for side in (0, 1):
            lo, hi = out[:, :, side, 0], out[:, :, side, 1]
            kid_s.append(np.stack([(lo & _NOT1) ^ (cw_seed[i, 0][:, None] & tm), hi ^ (cw_seed[i, 1][:, None] & tm)]))
            kid_t.append((lo & np.uint64(1)).astype(np.uint8) ^ (((cw_t[i] >> np.uint8(side)) & np.uint8(1))[:, None] & t))
            if not p.level_payload:
                kid_acc.append(acc)
            elif p.prime:  # child side's elements side*width + e of both (`_values`)
                v = np.moveaxis(vals[:, :, side * w : (side + 1) * w], 2, 0)
                kid_acc.append(F.add(acc, F.add(v, cw_v[i][:, :, None] & tm)))
            else:  # word side*width + e of the VALUE blocks, two words a block
                words = out[:, :, 2:, :].reshape(n, m, -1)[:, :, side * w : (side + 1) * w]
                kid_acc.append(acc + np.moveaxis(words, 2, 0) + (cw_v[i][:, :, None] & tm))
        # children in prefix order (left, right of each node), then only the prefixes of the range
        first = 2 * (start >> (bits - i))
        keep = slice((start >> (bits - 1 - i)) - first, (last >> (bits - 1 - i)) - first + 1)
        s = np.stack(kid_s, axis=-1).reshape(2, n, 2 * m)[:, :, keep].copy()
        t = np.stack(kid_t, axis=-1).reshape(n, 2 * m)[:, keep].copy()
        acc = np.stack(kid_acc, axis=-1).reshape(w, n, 2 * m)[:, :, keep].copy()
    m = s.shape[2]
    conv = convert(p, s.reshape(2, n * m)).reshape(w, n, m)
    cw_last = np.broadcast_to(cw_v[-1][:, :, None], (w, n, m))
    t = t.reshape(n, m)
    if p.prime:
        v = _finish_prime(acc, conv, t, cw_last, party)
    else:
        v = acc + conv + (cw_last & (np.uint64(0) - t.astype(np.uint64)))
        if party == 1:
            v = np.uint64(0) - v
        v &= np.uint64(p.mask)
    return np.ascontiguousarray(np.moveaxis(v, 0, -1))
