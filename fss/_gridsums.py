"""`eval_grid`'s values over F_p reduced per key to linear sketches (`_linear`) inside the grid kernel,
without the (n, size, width) array. Private; `fss.backend.eval_grid_sums` calls it on the fast tiers."""
from __future__ import annotations

import numpy as np

from . import fast, field
from ._aes import require
from ._linear import MAX_DOTS, lane_streams, lane_weights, lanes_for, sums_of
from .keys import KeyBatch


def eval_grid_sums(batch: KeyBatch, start: int, size: int, reverse: bool, tier: str, weights: np.ndarray, offs: np.ndarray,
                   threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`sums_of(fast.eval_grid(...), weights, offs)` for a batch over F_p, without the (n, size,
    width) array: each key's row is written to a ring of two rows and reduced to its sketch while it
    is in cache (one pass of round one's check, `dpcdf`). weights (q, size, c) canonical, offs (q,).
    The sketch runs in 32 x 32-bit lanes on split weights (`_linear.lane_streams`: dots on disjoint
    columns share a stream where each lane holds one column of the row, else one stream per dot), with
    the whole row's column sums (the first c kept); past MAX_LANE_DOTS dots, on the whole array."""
    tier = require(tier)
    p, n = batch.params, len(batch)
    q, c = weights.shape[0], weights.shape[2]
    offs_t = tuple(int(o) for o in offs)
    lanes = lanes_for(tier)
    streams = lane_streams(p.width, c, offs_t, lanes) if offs_t else None
    if fast._unfit(batch, tier) or not p.prime or (streams is None and not 1 <= len(offs) <= MAX_DOTS):
        return sums_of(fast.eval_grid(batch, start, size, reverse, tier, threads), weights, offs)
    if streams is None:
        lanes, wf, kept = 0, weights.reshape(q, size * c), c
    else:
        wf, kept = lane_weights(weights, offs_t, p.width, streams), p.width
    dots, last = np.zeros((n, q), np.uint64), np.zeros((n, p.width), np.uint64)
    cols = [np.zeros(size * kept, np.uint64) for _ in range(max(1, min(threads, n // fast.GROUP)))]
    rejected = np.zeros(0, np.int64)
    if n:
        ring = np.empty((2, size, p.width), np.uint64)
        rejected = fast._grid_run(batch, start, size, reverse, tier, threads, ring, (c, offs_t, lanes),
                                  lambda k: (wf, dots, cols[k], last))
    col = cols[0]
    for other in cols[1:]:
        col = field.add(col, other)
    col = np.ascontiguousarray(col.reshape(size, kept)[:, :c]).reshape(-1)
    if rejected.size:  # keys the kernel left out (a rejected F_p element, `prg.resample`): on the portable backend
        from . import portable

        d, more, tail = sums_of(portable.eval_grid(batch.select(rejected), start, size, reverse), weights, offs)
        dots[rejected], last[rejected] = d, tail
        col = field.add(col, more.reshape(-1))
    return dots, col.reshape(size, c), last
