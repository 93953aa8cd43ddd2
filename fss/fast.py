"""The fast backend: the fused kernels of `_fused` and `_grid` on one of the CPU's AES tiers
("aesni": 128-bit AES-NI, "vaes256": 256-bit VAES on AVX2, "vaes": 512-bit VAES on AVX-512,
"aarch64": the ARMv8 crypto extension; every function here takes the tier's name), spread over all cores.

Every kernel is a serial `nogil` numba function over a range of key groups; `_spread` splits the groups
over a small thread pool when there are enough of them, and runs a small batch in the caller's thread.
Not numba's `parallel=True`: a prange kernel compiles in about twice as long (once per width, DCF or
DPF, payload dtype and tier), and every call of one wakes numba's OpenMP pool, whose spin-wait cost
about 8 ms per call on a loaded two-core machine (a single `eval` of one key took 8 ms instead of 0.07).

Same contract as the portable `fss.portable` (internal points, (width, n) outputs reduced mod
2^out_bits) and bit-identical results. Works group by group on `KeyBatch`'s grouped layout; the
padded lanes of the last group are evaluated and dropped. `eval_grid` instead walks each key's tree
on its own with the step of `_grid` (also over F_p; `_blockgrid`'s where it fits), and splits the
keys over a thread pool.
"""
from __future__ import annotations

import functools
import threading

import numba
import numpy as np
from numba import njit

from . import _cache
from ._aes import require, round_keys
from ._eval import eval_group
from ._fused import gen_group, trie_steps
from ._blockgrid import block_step, fits
from ._grid import grid_step
from ._linear import fold_all, lane_sketch, no_sketch, row_sketch
from .errors import ParameterError
from .keys import GROUP, KeyBatch, groups, payload_dtype, to_groups
from .params import TreeParams

MAX_WIDTH = 8  # wider payloads take the portable backend (the fused kernel unrolls over elements; 8 covers a verified
# calibration task's keys, 3 values and their 3 MAC tags: eval 1,797 -> 56,739 reports/s at 2^10, docs/verification.md)


def _tag(width: int, has_v: bool, tier: str) -> str:
    """The compile-time choices of a kernel, naming its entries in the on-disk cache (`_cache`)."""
    return f"w{width}-{'dcf' if has_v else 'dpf'}-{tier}"


@functools.lru_cache(maxsize=None)
def _batch_kernel(width: int, has_v: bool, tier: str):
    group = eval_group(width, has_v, False, tier)

    @njit(nogil=True)
    def kernel(seeds, cw_seed, cw_t, cw_v, xs, party, bits, mask, rk, out, g0, g1):
        for g in range(g0, g1):
            group(seeds, cw_seed, cw_t, cw_v, xs, g, party, bits, mask, rk, out, g * GROUP)

    return _cache.cached(kernel, _tag(width, has_v, tier))


@functools.lru_cache(maxsize=None)
def _sum_kernel(width: int, has_v: bool, tier: str):
    group = eval_group(width, has_v, True, tier)

    @njit(nogil=True)
    def kernel(seeds, cw_seed, cw_t, cw_v, x, n, party, bits, mask, rk, partial, c, g0, g1):
        scratch = np.empty((width, GROUP), np.uint64)
        acc = np.zeros(width, np.uint64)
        for g in range(g0, g1):
            group(seeds, cw_seed, cw_t, cw_v, x, g, party, bits, mask, rk, scratch, 0)
            lanes = min(GROUP, n - g * GROUP)  # the last group's padding is not counted
            for e in range(width):
                for j in range(lanes):
                    acc[e] += scratch[e, j]
        for e in range(width):  # element by element (see `_put`)
            partial[c, e] = acc[e]

    return _cache.cached(kernel, _tag(width, has_v, tier))


# Pool threads are used only when each gets at least this much work (in groups of 16 keys times the
# relative cost of a group): handing a part to a thread costs tens of microseconds, more on a busy
# machine, and one group's eval about 2 us.
MIN_GROUPS_PER_THREAD = 64


def _spread(run, groups: int, threads: int | None, weight: float = 1.0) -> int:
    """Calls run(part, g0, g1) over consecutive ranges of `groups` groups that cover them all, part
    0 in this thread and the others on the pool; at most `threads` parts, and one part (no pool)
    unless each gets MIN_GROUPS_PER_THREAD * weight-adjusted groups. Returns the number of parts."""
    cap = min(int(groups * weight) // MIN_GROUPS_PER_THREAD, groups)
    if cap <= 1:  # one part whatever the thread count (one key, or a few): no pool, no numba call
        run(0, 0, groups)
        return 1
    if threads is None:
        threads = numba.get_num_threads()
    parts = max(1, min(threads, cap))
    bounds = [groups * c // parts for c in range(parts + 1)]
    futures = [_threads_pool().submit(run, c, bounds[c], bounds[c + 1]) for c in range(1, parts)]
    try:
        run(0, bounds[0], bounds[1])
    finally:
        for f in futures:
            f.result()
    return parts


def parts_for(groups: int, threads: int | None, weight: float = 1.0) -> int:
    """The number of parts `_spread` will use (the rows of a partial-sum buffer)."""
    if threads is None:
        threads = numba.get_num_threads()
    return max(1, min(threads, int(groups * weight) // MIN_GROUPS_PER_THREAD, groups))


def _keys(batch: KeyBatch) -> tuple:
    return batch.seeds, batch.cw_seed, batch.cw_t, batch.cw_v


def eval_batch(batch: KeyBatch, xs: np.ndarray, tier: str, threads: int | None = None) -> np.ndarray:
    tier = require(tier)  # a name the CPU can run (True / False of older callers: 'vaes' / 'aesni')
    p, n = batch.params, len(batch)
    padded = batch.seeds.shape[0] * GROUP
    out = np.empty((p.width, padded), np.uint64)
    if n:
        xp = xs
        if n != padded or xs.dtype != np.uint64 or not (xs.flags.c_contiguous and xs.flags.writeable):  # pad; one array type
            xp = np.zeros(padded, np.uint64)
            xp[:n] = xs
        kernel = _batch_kernel(p.width, p.level_payload, tier)
        args = (*_keys(batch), xp, batch.party, p.bits, np.uint64(p.mask), round_keys(), out)
        _spread(lambda c, g0, g1: kernel(*args, g0, g1), batch.seeds.shape[0], threads)
    return out[:, :n]


OP_ONE, OP_BOTH, OP_LAST_ONE, OP_LAST_BOTH = 0, 1, 2, 3


@_cache.njit(nogil=True, inline="always")
def _put(prog, r, op, src, a1, a2, level, a3):
    """Row r of a trie program, element by element: assigning a tuple or an array to a row makes numba
    compile its shape-mismatch message (about 4 s of string formatting in each process)."""
    prog[r, 0], prog[r, 1], prog[r, 2], prog[r, 3], prog[r, 4], prog[r, 5] = op, src, a1, a2, level, a3


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
                _put(prog, ops, OP_LAST_ONE, slot, 1 if a == lo else 0, lo, level, 0)
            else:
                _put(prog, ops, OP_LAST_BOTH, slot, 0, lo, level, a)
            ops += 1
            level = bits
            continue
        if a == lo or a == hi:
            _put(prog, ops, OP_ONE, slot, nxt, 0, level, 1 if a == lo else 0)
        else:
            _put(prog, ops, OP_BOTH, slot, nxt, nxt + 1, level, 0)
            stack[sp, 0], stack[sp, 1], stack[sp, 2], stack[sp, 3] = level + 1, a, hi, nxt + 1
            sp += 1
            hi = a
        ops += 1
        slot = nxt
        level += 1
    return prog[:ops]


@functools.lru_cache(maxsize=None)
def _trie_kernel(width: int, has_v: bool, tier: str):
    step_one, step_both, last_one, last_both = trie_steps(width, has_v, tier)

    @njit(nogil=True)
    def kernel(seeds, cw_seed, cw_t, cw_v, prog, n, party, bits, mask, rk, partial, c, g0, g1):
        state = np.zeros((2 * (bits + 1), 3 + width, GROUP), np.uint64)
        row = partial[c]
        for g in range(g0, g1):
            lanes = min(GROUP, n - g * GROUP)  # the last group's padding is not counted
            for j in range(GROUP):  # element by element (see `_put`)
                state[0, 0, j], state[0, 1, j], state[0, 2, j] = seeds[g, 0, j], seeds[g, 1, j], party
                for e in range(width):
                    state[0, 3 + e, j] = 0
            for r in range(prog.shape[0]):
                op, src, a1, a2, level, a3 = prog[r, 0], prog[r, 1], prog[r, 2], prog[r, 3], prog[r, 4], prog[r, 5]
                if op == 0:  # child a3 of src into slot a1
                    step_one(state, src, a1, 0, a3, level, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, row)
                elif op == 1:  # both children into slots a1, a2
                    step_both(state, src, a1, a2, 0, level, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, row)
                elif op == 2:  # last level: child a1 is the leaf of point a2
                    last_one(state, src, a2, 0, a1, lanes, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, row)
                else:  # last level: both children, points a2 and a3
                    last_both(state, src, a2, a3, 0, lanes, cw_seed, cw_t, cw_v, g, party, bits, mask, rk, row)

    return _cache.cached(kernel, _tag(width, has_v, tier))


def eval_sum(batch: KeyBatch, points: np.ndarray, tier: str, threads: int | None = None) -> np.ndarray:
    """(m, width) sums. One point: one fused pass over the keys. Several: each group of keys walks
    its trees once over the union of the points' paths (a full grid of 2^b points costs about
    2^(b+1) node expansions per key, not b * 2^b)."""
    tier = require(tier)  # a name the CPU can run (True / False of older callers: 'vaes' / 'aesni')
    p, n = batch.params, len(batch)
    sums = np.zeros((points.shape[0], p.width), np.uint64)
    if not n or not points.shape[0]:
        return sums
    G = batch.seeds.shape[0]
    common = (n, batch.party, p.bits, np.uint64(p.mask), round_keys())
    if points.shape[0] == 1:
        partial = np.zeros((parts_for(G, threads), p.width), np.uint64)
        kernel = _sum_kernel(p.width, p.level_payload, tier)
        _spread(lambda c, g0, g1: kernel(*_keys(batch), points, *common, partial, c, g0, g1), G, threads)
        return partial.sum(axis=0, dtype=np.uint64, keepdims=True) & np.uint64(p.mask)
    unique, inverse = np.unique(points, return_inverse=True)
    prog = trie_program(unique, p.bits)
    weight = prog.shape[0] / p.bits  # about the number of paths a group walks
    partial = np.zeros((parts_for(G, threads, weight), unique.shape[0], p.width), np.uint64)
    kernel = _trie_kernel(p.width, p.level_payload, tier)
    _spread(lambda c, g0, g1: kernel(*_keys(batch), prog, *common, partial, c, g0, g1), G, threads, weight)
    return partial.sum(axis=0, dtype=np.uint64)[inverse.reshape(-1)] & np.uint64(p.mask)


GRID_BLOCK_BITS = 10  # the walk goes subtree by subtree of 2^10 leaves: a level's nodes stay in the L1/L2 cache


@functools.lru_cache(maxsize=None)
def _grid_kernel(width: int, has_v: bool, prime: int, tier: str, sketch: tuple = ()):
    """Keys k0 .. k1 - 1, one after the other, walk the plan of `grid_plan`, the last level's steps
    writing the leaves' shares straight into `out` (no prange: a parallel
    numba kernel compiles in about three times as long, once per width, group, DCF or DPF and AES
    flavour; `eval_grid` runs one call per thread instead). With `sketch` = (c, offsets, lanes), `out` is a
    ring of two rows and each key's row goes through `_linear.lane_sketch` (or with lanes 0 `row_sketch`;
    `_gridsums.eval_grid_sums`).
    `prime`: 0 ring, else the F_p key format version (`field_code`). Writes the keys whose walk met a
    rejected F_p element (`_grid`; their rows, and with `sketch` their sums, are left out) to
    `rejected` and returns how many (an int: an array returned from a kernel loaded from the disk cache
    needs numba's runtime set up for boxing, which `_cache` skips): the caller evaluates those on the
    portable backend, the others stand."""
    blocks = fits(width, has_v, prime, tier)  # nodes in AES-block layout (`_blockgrid`)
    step = block_step(width, tier, prime) if blocks else grid_step(width, has_v, prime, tier)
    rows = 3 + width
    sums = bool(sketch)
    row_sum = no_sketch if not sums else lane_sketch(width, *sketch) if sketch[2] else row_sketch(width, *sketch[:2])

    @njit(nogil=True)
    def kernel(seeds, cw_seed, cw_t, cw_v, top, subs, cols, top_cap, reverse, k0, k1, party, bits, mask, rk, out, wf, dots, col, last,
               rejected):
        flags = np.zeros(1, np.uint64)
        n_rejected = 0
        split = top.shape[0]  # levels of the first stage: the root down to the subtrees' roots
        sub_cap = 2 * (1 << subs.shape[1]) + 64
        ta, tb = np.empty((rows, top_cap), np.uint64), np.empty((rows, top_cap), np.uint64)
        sa, sb = np.empty((rows, sub_cap), np.uint64), np.empty((rows, sub_cap), np.uint64)
        kcw = np.zeros((bits + 1, rows), np.uint64)
        last_v = cw_v.shape[1] - 1
        size = out.shape[1]
        sign = -1 if reverse else 1
        for k in range(k0, k1):
            g, lane = k // GROUP, k % GROUP
            slot = k % 2 if sums else k  # with sums, out holds two rows: the key's, the one before
            for i in range(bits):
                kcw[i, 0] = cw_seed[g, i, 0, lane]
                kcw[i, 1] = cw_seed[g, i, 1, lane]
                kcw[i, 2] = cw_t[g, i, lane]
                if has_v:
                    for e in range(width):
                        kcw[i, 3 + e] = cw_v[g, i, e, lane]
            for e in range(width):
                kcw[bits, 3 + e] = cw_v[g, last_v, e, lane]
            if blocks:  # flat: the root's block at words 0, 1, its accumulators at 3 capacity (its t: party)
                flat = ta.reshape(rows * top_cap)
                flat[0], flat[1] = seeds[g, 0, lane], seeds[g, 1, lane]
                flat[3 * top_cap : 3 * top_cap + width] = 0
            else:
                ta[0, 0] = seeds[g, 0, lane]
                ta[1, 0] = seeds[g, 1, lane]
                ta[2, 0] = party
                for e in range(width):
                    ta[3 + e, 0] = 0
            top_nodes, top_base = ta, 0
            # segment 0: the first stage (the root down to level split); segment s: subtree s - 1.
            # One call site of `step` (its code is large): the segments share the level loop.
            for seg in range(1 + cols.shape[0]):
                if seg == 0:
                    a, d, first, stop = ta, tb, 0, split
                    lo = hi = origin = 0
                else:
                    a, d, first, stop = sa, sb, split, bits
                    q = top_base + seg - 1
                    if blocks:
                        flat, src = a.reshape(rows * sub_cap), top_nodes.reshape(rows * top_cap)
                        flat[0], flat[1] = src[2 * q], src[2 * q + 1]
                        for e in range(width):  # not a slice copy: that compiles numba's shape-error formatting
                            flat[3 * sub_cap + e] = src[3 * top_cap + width * q + e]
                    else:
                        for r in range(rows):
                            a[r, 0] = top_nodes[r, q]
                    # the leaves: child positions lo .. hi - 1 of the last level, to the key's row
                    lo = subs[seg - 1, bits - 1 - split, 0]
                    hi = lo + subs[seg - 1, bits - 1 - split, 1]
                    origin = slot * size + cols[seg - 1] - sign * lo
                b2, mm = 0, 1
                for level in range(first, stop):
                    leaf = level == bits - 1
                    for i in range(0, mm, 16):
                        step(a, b2 + i, d, 2 * i, kcw, level, leaf, out, origin, lo, hi, reverse, party, mask, rk, flags, mm - i)
                    if seg == 0:
                        b2, mm = top[level, 0], top[level, 1]
                    else:
                        b2, mm = subs[seg - 1, level - split, 0], subs[seg - 1, level - split, 1]
                    a, d = d, a
                if seg == 0:
                    top_nodes, top_base = a, b2
            if flags[0]:  # a rejected element: the portable backend resamples it (about 2^-61 an element)
                flags[0] = 0
                rejected[n_rejected] = k
                n_rejected += 1
            elif sums:  # the key's row, still in cache, reduced to its sketch (`_linear`)
                row_sum(out[slot].reshape(size * width), wf, dots[k], col, last[k])
            if sums and (k - k0) % 4 == 3:
                fold_all(col)
        if sums:
            fold_all(col)
        return n_rejected

    tag = f"-sums{sketch[0]}-{'.'.join(map(str, sketch[1]))}-l{sketch[2]}" if sums else ""
    return _cache.cached(kernel, f"grid-{_tag(width, has_v, tier)}-{('ring', 'p61', 'p61w')[prime]}{tag}")


def field_code(p: TreeParams) -> int:
    """The grid kernels' payload flavour: 0 over the ring, else the F_p key format version (1, 2)."""
    return p.version if p.prime else 0


@functools.lru_cache(maxsize=64)
def grid_plan(bits: int, start: int, size: int, reverse: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """How the kernel walks the subtree of the internal points start .. start + size - 1: level by
    level from the root down to level `split` = max(0, bits - GRID_BLOCK_BITS), then below each node
    of that level (the roots of subtrees of 2^(bits - split) leaves) level by level to the leaves.
    Expanding m nodes gives their 2m children in prefix order; (offset, count) says which of them
    are the prefixes of the range (the offset is 0 or 1). Returns

        top  (split, 2): (offset, count) after each level of the first stage
        subs (S, bits - split, 2): the same in each of the S subtrees
        cols (S,): the output column of each subtree's first leaf (point x is column x - start, or
            start + size - 1 - x with `reverse`; its leaves then go to decreasing columns)
        top_cap: buffer capacity the first stage needs
    Read-only (memoized)."""
    last = start + size - 1
    split = max(0, bits - GRID_BLOCK_BITS)

    def steps(lo: int, hi: int, first: int, stop: int) -> list[tuple[int, int]]:
        """(offset, count) after each level first .. stop - 1 for the range lo .. hi of leaves."""
        out = []
        for level in range(first, stop):
            parent, child = lo >> (bits - level), lo >> (bits - level - 1)
            out.append((child - 2 * parent, (hi >> (bits - level - 1)) - child + 1))
        return out

    top = np.array(steps(start, last, 0, split), dtype=np.int64).reshape(split, 2)
    k = bits - split
    roots = range(start >> k, (last >> k) + 1)
    subs, cols = [], []
    for r in roots:
        lo, hi = max(start, r << k), min(last, ((r + 1) << k) - 1)
        subs.append(steps(lo, hi, split, bits))
        cols.append(last - lo if reverse else lo - start)
    subs_a = np.array(subs, dtype=np.int64).reshape(len(roots), k, 2)
    cols_a = np.array(cols, dtype=np.int64)
    for a in (top, subs_a, cols_a):
        a.flags.writeable = False
    return top, subs_a, cols_a, 2 * len(roots) + 64


_pool = None
_pool_lock = threading.Lock()


def _threads_pool():
    """The worker threads of every kernel call (numba.config.NUMBA_NUM_THREADS of them, made once)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(max_workers=numba.config.NUMBA_NUM_THREADS, thread_name_prefix="fss")
    return _pool


def _unfit(batch: KeyBatch, tier: str) -> bool:
    """Not a key gen makes or the codec accepts, left to the portable backend: over F_p, a correction >= p
    or, for `_blockgrid` (t in bit 0 of the seeds), bit 0 of a seed correction set."""
    p = batch.params
    blocks = fits(p.width, p.level_payload, field_code(p), tier)
    return p.prime and len(batch) > 0 and (int(batch.cw_v.max()) >= p.modulus or blocks and bool((batch.cw_seed[:, :, 0] & 1).any()))


def _grid_run(batch: KeyBatch, start: int, size: int, reverse: bool, tier: str, threads: int, out, sketch: tuple, extra) -> np.ndarray:
    """The grid kernel (with `sketch`, `_grid_kernel`'s) over all keys, split over `threads` threads:
    `extra(c)` gives part c's (wf, dots, col, last) arguments. Returns the keys whose walk met a
    rejected F_p element: their rows of `out` and their sums are not computed, and the caller evaluates
    them on the portable backend (so a crafted key costs its own walk there, not its batch's)."""
    p, n = batch.params, len(batch)
    kernel = _grid_kernel(p.width, p.level_payload, field_code(p), tier, sketch)
    top, subs, cols, top_cap = grid_plan(p.bits, start, size, reverse)
    common = (batch.party, p.bits, np.uint64(p.mask), round_keys())
    cw_v = batch.cw_v.astype(np.uint64, copy=False)  # one kernel for 32- and 64-bit corrections
    keys = (batch.seeds, batch.cw_seed, batch.cw_t, cw_v)
    parts = max(1, min(threads, n // GROUP))
    bounds = [n * c // parts for c in range(parts + 1)]
    outs = [out] + [np.empty_like(out) if sketch else out for _ in range(1, parts)]  # with sums: a ring per thread
    rejected = [np.empty(bounds[c + 1] - bounds[c], np.int64) for c in range(parts)]
    run = lambda c: kernel(*keys, top, subs, cols, top_cap, reverse, bounds[c], bounds[c + 1], *common, outs[c], *extra(c),  # noqa: E731
                           rejected[c])
    futures = [_threads_pool().submit(run, c) for c in range(1, parts)]
    counts = [run(0)] + [f.result() for f in futures]
    return np.concatenate([r[:m] for r, m in zip(rejected, counts)])


def eval_grid(batch: KeyBatch, start: int, size: int, reverse: bool, tier: str, threads: int = 1) -> np.ndarray:
    """Same contract as `portable.eval_grid`: (n, size, width) shares at internal points start + j
    (or start + size - 1 - j with `reverse`). Each key walks the range's subtree once (`grid_plan`);
    the keys are split over `threads` threads."""
    tier = require(tier)  # a name the CPU can run (True / False of older callers: 'vaes' / 'aesni')
    p, n = batch.params, len(batch)
    if _unfit(batch, tier):
        from . import portable

        return portable.eval_grid(batch, start, size, reverse)
    out = np.empty((n, size, p.width), np.uint64)
    if n:
        none = (np.zeros((0, 0), np.uint64), np.zeros((1, 0), np.uint64), np.zeros(0, np.uint64), np.zeros((1, 0), np.uint64))
        rejected = _grid_run(batch, start, size, reverse, tier, threads, out, (), lambda c: none)
        if rejected.size:  # keys that met a rejected F_p element (`prg.resample`): about 2^-61 an element
            from . import portable

            out[rejected] = portable.eval_grid(batch.select(rejected), start, size, reverse)
    return out


@functools.lru_cache(maxsize=None)
def _gen_kernel(width: int, has_v: bool, tier: str):
    group = gen_group(width, has_v, tier)

    @njit(nogil=True)
    def kernel(alphas, betas, roots, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v, g0, g1):
        for g in range(g0, g1):
            group(alphas, betas, roots, g, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v)

    return _cache.cached(kernel, _tag(width, has_v, tier))


@functools.lru_cache(maxsize=256)
def _gen_constants(p: TreeParams, tier: str) -> tuple:
    """A function's one-key gen kernel (`_one_kernel`) and its scalar arguments, worked out once per (function, tier)."""
    ones = np.uint64(2**64 - 1)
    below = ones if p.beta_below else np.uint64(0)
    equal = ones if p.beta_equal else np.uint64(0)
    joint = payload_dtype(p) == np.uint64  # cw_v in cw_seed's allocation (else its own, 32-bit)
    cw_size = (2 * p.bits + (p.v_levels * p.width if joint else 0)) * GROUP
    return _one_kernel(p.width, p.level_payload, require(tier), joint), p.bits, np.uint64(p.mask), below, equal, p.width, cw_size, joint


_one = threading.local()  # each thread's staging arrays for `gen_one` (the kernel reads them; zeroed after)
_NO_V = np.zeros((1, 1, 1, 1), np.uint64)  # `_one_kernel`'s own_v where cw_v lies in `out` (64-bit payloads): never read


@functools.lru_cache(maxsize=None)
def _one_kernel(width: int, has_v: bool, tier: str, joint: bool):
    """One key's gen in one compiled call (issue 45, one-key latency): its root seeds and payload put in lane 0
    of this thread's staging (`_staging`, where the caller put alpha), the gen intrinsic for the first 8 lanes
    (`gen_group` with one half: half a group's AES work), both parties' seeds copied out, and the staging's
    lane 0 zeroed again. The intrinsic is called here, not through `_gen_kernel`'s dispatcher: a cached
    kernel calling another dispatcher can be linked to a same-named function of another process's cache."""
    group = gen_group(width, has_v, tier, 1)

    @njit(nogil=True)
    def one(words, beta, flat, bits, mask, below, equal, rk, out, cw_t, own_v, v_levels, s0, s1):
        w = beta.shape[0]
        roots, alphas = flat[: 4 * GROUP].reshape((2, 2, GROUP)), flat[4 * GROUP: 5 * GROUP]
        betas = flat[5 * GROUP: (5 + w) * GROUP].reshape((w, GROUP))
        cw_seed = out[: 2 * bits * GROUP].reshape((1, bits, 2, GROUP))
        cw_v = out[2 * bits * GROUP:].reshape((1, v_levels, w, GROUP)) if joint else own_v
        for j in range(4):
            flat[j * GROUP] = words[j]
        for e in range(w):
            flat[(5 + e) * GROUP] = beta[e]
        group(alphas, betas, roots, 0, bits, mask, below, equal, rk, cw_seed, cw_t, cw_v)
        for j in range(2):  # each party's seed into its own array
            s0[0, j, 0] = flat[j * GROUP]
            s1[0, j, 0] = flat[(2 + j) * GROUP]
        for r in range(5 + w):  # no seed, alpha or payload stays staged
            flat[r * GROUP] = 0

    return _cache.cached(one, _tag(width, has_v, tier) + ("-one" if joint else "-one32"))


def _staging(w: int) -> np.ndarray:
    """This thread's staging for one key: a (5 + w) * GROUP array, zero but in lane 0 during a gen, laid
    out as the kernel's roots (2, 2, GROUP), alphas (GROUP,) and betas (w, GROUP), one after another
    (`_one_kernel` makes those views itself)."""
    staged = getattr(_one, "staged", None)
    if staged is None:
        staged = _one.staged = {}
    if w not in staged:
        staged[w] = np.zeros((5 + w) * GROUP, np.uint64)
    return staged[w]


def gen_one(p: TreeParams, alpha: int, beta, randomness: bytes, tier: str) -> tuple[KeyBatch, KeyBatch]:
    """`gen_batch` of one key (internal `alpha`, payload `beta`: an int or (width,) values, `randomness`
    its 32 root-seed bytes, laid out as `gen_batch`'s roots), without its reshaping and padding: one
    key's latency is then one compiled call of half a group's work (`_one_kernel`) and little else (issue 45).
    The same keys, bit for bit (tests/fss_tests/test_one_key_paths.py); each party's seed in its own
    read-only array, the shared corrections in one."""
    if len(randomness) != 32:  # (the kernel reads four words of it)
        raise ParameterError(f"one key's gen takes 32 bytes of root seeds, got {len(randomness)}")
    one, bits, mask, below, equal, w, cw_size, joint = _gen_constants(p, tier)
    flat = _staging(w)
    # zeros: the kernel writes lanes 0 to 7 only. Each party's seed in its own array (neither key holds the
    # other's seed, not even through `.base`); the shared corrections together in `out`
    s0, s1 = np.zeros((1, 2, GROUP), np.uint64), np.zeros((1, 2, GROUP), np.uint64)
    out = np.zeros(cw_size, np.uint64)
    cw_t = np.zeros((1, bits, GROUP), np.uint8)
    v_shape = (1, p.v_levels, w, GROUP)
    own_v = _NO_V if joint else np.zeros(v_shape, payload_dtype(p))  # (joint: cw_v is in `out`)
    betas = np.empty(w, np.uint64)
    betas[:] = beta  # (an int, or the width's values)
    flat[4 * GROUP] = alpha
    try:
        one(np.frombuffer(randomness, "<u8"), betas, flat, bits, mask, below, equal, round_keys(), out, cw_t, own_v, p.v_levels,
            s0, s1)
    except BaseException:  # (the kernel zeroes the staging's lane 0 itself when it returns)
        flat[0:: GROUP] = 0
        raise
    finally:
        betas[:] = 0
    for a in (s0, s1, out, cw_t) if joint else (s0, s1, out, cw_t, own_v):  # read-only, and every view made of them below
        a.setflags(write=False)
    cw_seed = out[: 2 * bits * GROUP].reshape(1, bits, 2, GROUP)
    cw_v = out[2 * bits * GROUP:].reshape(v_shape) if joint else own_v
    return KeyBatch._of(p, 0, 1, s0, cw_seed, cw_t, cw_v), KeyBatch._of(p, 1, 1, s1, cw_seed, cw_t, cw_v)


def gen_batch(p: TreeParams, alphas: np.ndarray, betas: np.ndarray, roots: np.ndarray, tier: str,
              threads: int | None = None) -> tuple[KeyBatch, KeyBatch]:
    """Same contract as `portable.gen_batch`, writing the grouped arrays directly."""
    tier = require(tier)  # a name the CPU can run (True / False of older callers: 'vaes' / 'aesni')
    n, w = alphas.shape[0], p.width
    G = groups(n)
    def pad(a):  # a new C-contiguous, writable array (the kernels' one argument type), zero lanes up to whole groups
        out = np.zeros(a.shape[:-1] + (G * GROUP,), a.dtype)
        out[..., :n] = a
        return out

    cw_seed = np.empty((G, p.bits, 2, GROUP), np.uint64)
    cw_t = np.empty((G, p.bits, GROUP), np.uint8)
    cw_v = np.empty((G, p.v_levels, w, GROUP), payload_dtype(p))
    if n:
        ones = np.uint64(2**64 - 1)
        below = ones if p.beta_below else np.uint64(0)
        equal = ones if p.beta_equal else np.uint64(0)
        kernel = _gen_kernel(w, p.level_payload, tier)
        padded_roots = pad(roots)  # the kernel only reads it
        args = (pad(alphas), pad(betas), padded_roots, p.bits, np.uint64(p.mask), below, equal, round_keys(), cw_seed, cw_t, cw_v)
        _spread(lambda c, g0, g1: kernel(*args, g0, g1), G, threads, 4.0)  # a group's gen: about 4 evals
    if G == 1:  # one group (one key, or a few): party d's seeds are padded_roots[d] as they lie, copied so
        s0, s1 = padded_roots[0:1].copy(), padded_roots[1:2].copy()  # that neither key holds the other's seed
    else:
        s0, s1 = to_groups(roots[0]), to_groups(roots[1])
    for a in (s0, s1, cw_seed, cw_t, cw_v):  # read-only once (the corrections shared by both parties' batches)
        a.setflags(write=False)
    return KeyBatch._of(p, 0, n, s0, cw_seed, cw_t, cw_v), KeyBatch._of(p, 1, n, s1, cw_seed, cw_t, cw_v)
