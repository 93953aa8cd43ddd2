"""DAWA (Li, Hay, Miklau, Wang, "A Data- and Workload-Aware Algorithm for Range Queries Under
Differential Privacy", VLDB 2014) on a 1-D histogram and the workload of all prefix queries: a peer for
bench/accuracy_sweep.py only, not part of dpcdf. Written here from the paper; the authors' released code
(L1partition_approx) was read, not copied, for two details: the clip below and the noise scale.

Stage 1, eps1 = ratio * eps (ratio 0.25, the paper's): the paper's approximate L1 partition. Every
interval of dyadic length (1, 2, 4, ..., at any start) gets the cost max(dev + Z, 0) + c: dev is the L1
deviation of its counts from their mean (rounded to an integer), Z ~ DLap(2 / eps1) its noise, c = 1 / eps2
the noise cost of one bucket; a dynamic programme picks the partition of the bins into such intervals of
least total cost (O(n log n) candidates; the deviations take O(n^2) once per histogram, cached).
Stage 2, eps2 = eps - eps1: each bucket's count from a b-ary tree over the buckets (padded with empty
buckets to b^h; every level noised at one scale; least-squares consistent; b in 2, 4, 8, ..., up to one
level under the root, whichever minimises the mean number of nodes covering a prefix times the noise
variance per node for this number of buckets), spread uniformly over its bins; the result is the prefix
sums at every bin.

Simplifications and deviations from the paper:
- Noise is the project's exact discrete Laplace (`secure_noise`) at the paper's scales, on integers
  (counts, and deviations rounded to integers): a faithful variant of DAWA on integer counts.
- Stage 2 is a plain b-ary tree whose b is chosen for the number of buckets, not GreedyH's greedily
  weighted hierarchy (the brief allowed this).
- The clip max(., 0) of a noisy deviation is the authors' code's (we could not check the paper's text
  for it); without it (`clip=False`) the programme picks the tilings whose noise is most
  negative and cuts flat stretches into many small buckets, at every epsilon (the noise-to-cost ratio
  (2 / eps1) / (1 / eps2) = 6 does not depend on epsilon).
- Under substitution every noise scale and the cost c are doubled (a substitution is a removal and an
  addition), and the tree's root is n itself, public, so it is exact.
- Ties in stage 1 are broken by a data-independent uniform value in [0, 1/(n+1)) per interval (numpy's
  generator: not private, only makes the minimum unique).

Privacy, under `relation` ("add-remove": one record added or removed; "substitution": one record
changed; every budget rounded down to a rational by `scale_fraction`). Stage 2 is eps2-DP given the
partition: a record is in one bucket, so in one node of each noised level (L1 sensitivity = the number
of noised levels, twice that under substitution). Stage 1, as the paper states it, is eps1-DP, so DAWA
is eps-DP by sequential composition; that is the guarantee of the default, which we take from the paper
without vouching for it. Our own argument: fix the noise of every interval without the changed bin i;
the output is then fixed by the argmin over the intervals J holding i of A_J + cost_J (A_J the least cost
of the rest, the same on both neighbours), a report-noisy-min whose scores move by at most Delta each,
which noise DLap(2 Delta / eps1) makes eps1-DP. That covers `cost="median", clip=False`: the deviation
from the median, min over constants of sum |x - c|, an integer with Delta = 1, so stage 1 is eps1-DP at
the paper's scale and the whole is eps-DP. For the mean deviation (Delta = 2) at the paper's scale the
argument gives 2 eps1 without the clip (so (1 + ratio) eps in all), and with the clip it does not apply
(a clipped score cannot drop below its floor): the default is a peer at its published accuracy and its
stated guarantee, not one this code proves.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

from dpcdf.release.noise import dlaplace_variance, scale_fraction, secure_noise

RATIO = 0.25


@njit(cache=True)
def _deviations(x, median):
    """dev[k, s]: the L1 deviation of x[s : s + 2^k] from its median (or its mean, rounded), for every
    dyadic length 2^k <= n and start s <= n - 2^k (else 0); a sorted window slides along x."""
    n = x.size
    levels = 0
    while (1 << levels) <= n:
        levels += 1
    dev = np.zeros((levels, n), np.int64)
    for k in range(1, levels):
        size = 1 << k
        w = np.sort(x[:size])
        for s in range(n - size + 1):
            if s > 0:  # drop x[s - 1], insert x[s + size - 1], keeping w sorted
                i = np.searchsorted(w, x[s - 1])
                j = np.searchsorted(w, x[s + size - 1])
                if j > i:
                    for t in range(i, j - 1):
                        w[t] = w[t + 1]
                    w[j - 1] = x[s + size - 1]
                else:
                    for t in range(i, j, -1):
                        w[t] = w[t - 1]
                    w[j] = x[s + size - 1]
            d = 0
            if median:  # sum |w - median| pairs the largest with the smallest
                for t in range(size // 2):
                    d += w[size - 1 - t] - w[t]
            else:  # sum |size * w - total| / size, rounded
                total = w.sum()
                for t in range(size):
                    d += abs(size * w[t] - total)
                d = (2 * d + size) // (2 * size)
            dev[k, s] = d
    return dev


@njit(cache=True)
def _least_cost_partition(cost):
    """Starts of the buckets of the least-cost partition; cost[k, s]: the cost of bucket [s, s + 2^k)."""
    levels, n = cost.shape
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    start = np.zeros(n + 1, np.int64)
    for end in range(1, n + 1):
        for k in range(levels):
            s = end - (1 << k)
            if s < 0:
                break
            c = best[s] + cost[k, s]
            if c < best[end]:
                best[end] = c
                start[end] = s
    starts = np.empty(n, np.int64)  # backwards from the last bucket
    count, end = 0, n
    while end > 0:
        end = start[end]
        starts[count] = end
        count += 1
    return starts[:count][::-1].copy()


@functools.lru_cache(maxsize=16)
def _cached_deviations(data: bytes, median: bool) -> np.ndarray:
    return _deviations(np.frombuffer(data, np.int64), median)


def factor(relation: str) -> int:
    if relation not in ("add-remove", "substitution"):
        raise ValueError(f"relation must be 'add-remove' or 'substitution', got {relation!r}")
    return 2 if relation == "substitution" else 1


def partition(hist: np.ndarray, eps1: float, eps2: float, relation: str, cost: str = "mean",
              clip: bool = True) -> np.ndarray:
    """Stage 1: the starts of the private partition's buckets (the first is 0)."""
    if cost not in ("mean", "median"):
        raise ValueError(f"cost must be 'mean' or 'median', got {cost!r}")
    x = np.ascontiguousarray(hist, dtype=np.int64)
    dev = _cached_deviations(x.tobytes(), cost == "median")
    noisy = dev.astype(np.float64) + factor(relation) / eps2  # the paper's bcost: deviation + noise cost
    n = x.size
    for k in range(1, dev.shape[0]):  # singletons (k = 0) deviate by 0 whatever the data: no noise
        count = n - (1 << k) + 1
        noisy[k, :count] += secure_noise(count, scale_fraction(2 * factor(relation), eps1))
    if clip:
        noisy = np.maximum(noisy, factor(relation) / eps2)
    noisy += np.random.default_rng().uniform(0, 1 / (n + 1), noisy.shape)  # tie-breaks (not private)
    return _least_cost_partition(noisy)


def tree_shape(m: int, relation: str) -> tuple[int, int]:
    """(b, h): the branching factor and number of levels below the root of the tree over m buckets that
    minimises the mean over prefixes k = 1..m of (number of covering nodes) x (noise variance per node)."""
    best = None
    b = 2
    while True:
        h = 1
        while b**h < m:
            h += 1
        levels = h + (relation == "add-remove")  # the root is noised only under add/remove
        k, nodes = np.arange(1, m + 1), np.zeros(m)
        while k.any():  # covering nodes of prefix k: the sum of its base-b digits
            nodes += k % b
            k //= b
        score = nodes.mean() * levels**2
        if best is None or score < best[0]:
            best = (score, b, h)
        if h == 1:
            return best[1], best[2]
        b *= 2


def tree_counts(counts: np.ndarray, eps2: float, relation: str) -> np.ndarray:
    """Stage 2: consistent noisy counts of the buckets from a b-ary tree over them."""
    m = counts.size
    b, h = tree_shape(m, relation)
    leaves = np.zeros(b**h, np.int64)
    leaves[:m] = counts
    true = [leaves]
    for _ in range(h):
        true.append(true[-1].reshape(-1, b).sum(axis=1))
    noised = h + (relation == "add-remove")
    scale = scale_fraction(noised * factor(relation), eps2)
    var = [dlaplace_variance(scale)] * noised + [0.0] * (h + 1 - noised)  # substitution: the root is n
    y = [t + secure_noise(t.size, scale) if v else t for t, v in zip(true, var)]
    return consistent(y, var, b)[:m]


def consistent(y: list[np.ndarray], var: list[float], b: int) -> np.ndarray:
    """The least-squares leaves of a complete b-ary tree from its noisy levels y[0] (leaves) .. y[-1]
    (root), level l with noise variance var[l] (0: exact): bottom-up, each node's estimate from its
    subtree (itself and its children's sum, weighted by inverse variance); top-down, each node's surplus
    over its children's sum split evenly among them."""
    z, vz = [np.asarray(y[0], np.float64)], [var[0]]
    for level in range(1, len(y)):
        s, vs = z[-1].reshape(-1, b).sum(axis=1), b * vz[-1]
        w = vs / (var[level] + vs)
        z.append(w * y[level] + (1 - w) * s)
        vz.append(var[level] * w)
    est = z[-1]
    for level in range(len(y) - 1, 0, -1):
        est = z[level - 1] + np.repeat((est - z[level - 1].reshape(-1, b).sum(axis=1)) / b, b)
    return est


def dawa_prefix(hist: np.ndarray, eps: float, relation: str, ratio: float = RATIO, cost: str = "mean",
                clip: bool = True) -> np.ndarray:
    """DAWA's estimate of the prefix counts hist[:t + 1].sum() at every bin t (float64, shape of hist)."""
    eps1, eps2 = ratio * eps, (1 - ratio) * eps
    hist = np.asarray(hist, dtype=np.int64)
    starts = partition(hist, eps1, eps2, relation, cost, clip)
    est = tree_counts(np.add.reduceat(hist, starts), eps2, relation)
    lengths = np.diff(np.append(starts, hist.size))
    return np.cumsum(np.repeat(est / lengths, lengths))
