"""Each candidate round-two design's expected error, estimated from round one (plan version 6).

`AdaptiveMechanism.plan` (version 6) proposes a histogram from round one as version 5 did, then keeps
it only when its estimated error, with a safety factor, is below the tree's; the tree (with round
one's counts reused in it, `merge`) is always the other candidate. Errors are mean squared errors of
the prefix counts per grid index, in counts:

- the tree's: exact, from public parameters (the consistent estimate's variance less what round
  one's counts add, `merge.RoundOneMerge`; version 9: the whole tree's own, round one being one of its
  levels), cached per mechanism;
- a histogram's: its noise exactly (`histogram.bins_noise`), plus what interpolation inside its
  bins misses of the data. That bias grows with the square of the counts, so on large data it
  decides. What round one's coarse counts (with their fine bins' sums) see of it is estimated
  without bias, their noise's share subtracted exactly (`interpolation_miss`); inside a fine bin
  nothing is seen, and the estimate takes each fine bin's mass as a point mass at an unknown place
  (the worst case real data shows: integer or rounded values on a finer grid, one value holding most
  of the records), which costs c^2 / 6 per grid index of the bin it lies in, on average over its
  place (`hidden_miss`). That errs towards the tree, and so does taking the seen miss one sd of its
  estimate high (`SEEN_SDS`): at small epsilon round one's noise hides what a few bins miss.

Post-processing of round one: no privacy cost.
"""
from __future__ import annotations

import math

import numpy as np

from .histogram import bins_noise, energy_form, linear_energy, linear_map
from .merge import RoundOneMerge, tree_prefix_variance
from .noise import dlaplace_variance

SAFETY = 2.0  # a histogram is kept when its estimated error times this is below the tree's (whose smoothed error is
# often well below its noise variance, the reference here)
SEEN_SDS = 1.0  # ... its estimated miss taken one sd of that estimate high (round one's noise may hide a miss)
POINT_MASS = 1 / 6  # mean over a point mass's place in a bin of its interpolation error's mean square, over c^2
_SAMPLE = 128  # prefixes at which the tree's exact variance is averaged
MAX_REUSE_GRID = 1 << 14  # larger grids: no reuse, and the tree's error is its covering estimate's (`tree_error`):
# the merge's S B' is grid x 288 floats (x 544 with version 7's round zero: 396 MB at 2^14) and the exact variance
# grid x 128 (2^20 points: 10 GB and 96 s, review)
_TREE_ERRORS: dict[tuple, float] = {}


def interpolation_miss(counts: np.ndarray, at: np.ndarray, knots: np.ndarray, variance: float, size: int,
                       n: float | None, sds: float = 0.0) -> float:
    """An unbiased estimate (clipped at 0) of the mean square, per grid index, of what linear
    interpolation between `knots` misses of the cumulative of noisy `counts` of bins ending at `at`
    (linear between them): its squared departure less the exact part the counts' noise (`variance`
    each) explains; `n` (substitution) conditions the counts on it; plus `sds` standard deviations of
    that estimate (the noise's share of a quadratic form: 2 var^2 |G|_F^2 + 4 var |N' Q m|^2, as for
    Gaussian noise), so that a miss round one's noise hides counts. O(bins^2), whatever the grid."""
    if np.isin(at, knots).all():
        return 0.0
    k = counts.size
    cum = np.tril(np.ones((k, k)))
    if n is not None:  # conditioned on n: the noise enters as (I - 11^T / k) z
        counts = counts + (n - counts.sum()) / k
        cum = cum @ (np.eye(k) - 1.0 / k)
    at, knots = np.append(-1, at), np.append(-1, knots)
    union = np.union1d(at, knots)  # the departure is linear between these
    values = np.vstack([np.zeros((1, k + 1)), np.column_stack([np.cumsum(counts), cum])])  # estimate, then noise
    miss = (linear_map(at, union) - linear_map(knots, union) @ linear_map(at, knots)) @ values
    energy = linear_energy(miss, np.diff(union))
    estimate = float(energy[0] - variance * energy[1:].sum())
    if sds:
        q = energy_form(np.diff(union))
        noise = miss[:, 1:]
        gram = noise.T @ q @ noise
        spread = 2 * variance**2 * float(np.sum(gram**2)) + 4 * variance * float(np.sum((noise.T @ q @ miss[:, 0]) ** 2))
        estimate += sds * math.sqrt(max(spread, 0.0))
    return max(0.0, estimate) / size


def hidden_miss(counts: np.ndarray, at: np.ndarray, knots: np.ndarray, variance: float, size: int) -> float:
    """What a histogram with bins ending at `knots` may miss inside round one's bins (ending at `at`,
    noisy `counts` of `variance` each), per grid index: each bin's mass as a point mass, POINT_MASS c^2
    over the grid indices of the narrower of it and the widest histogram bin it meets; c^2 estimated
    without bias (the count squared less its noise variance, summed, then clipped at 0)."""
    at, knots = np.asarray(at, np.int64), np.asarray(knots, np.int64)
    starts = np.append(0, at[:-1] + 1)
    widths = np.diff(np.append(-1, knots))
    first, last = np.searchsorted(knots, starts), np.searchsorted(knots, at)  # the histogram bins each meets
    widest = np.array([widths[a:b + 1].max() for a, b in zip(first, last)], np.int64)
    reach = np.minimum(at - starts + 1, widest)
    mass = np.asarray(counts, np.float64) ** 2 - variance
    return POINT_MASS * max(0.0, float(np.sum(np.where(reach > 1, reach * mass, 0.0)))) / size


def histogram_error(mech, counts: np.ndarray, knots: np.ndarray, n: float | None, copies: int = 1) -> float:
    """A round-two histogram's (bins ending at `knots`) estimated error (module docstring): its noise,
    plus the miss round one's coarse counts (with their fine bins' sums) see, plus the hidden one at
    the fine bins (the fine bins' own departure from the plan is left to `hidden_miss`: at small
    epsilon its unbiased estimate has a noise far above the tree's whole error)."""
    counts = np.asarray(counts, np.float64)
    noise = bins_noise(np.asarray(knots, np.int64), mech.size, mech.noise_variance(2, copies), n is not None)
    coarse, var_coarse = mech.coarse_counts(counts, copies)
    seen = interpolation_miss(coarse, mech.round_one_ends, knots, var_coarse, mech.size, n, SEEN_SDS)
    if not mech.fine:
        return noise + seen + hidden_miss(coarse, mech.round_one_ends, knots, var_coarse, mech.size)
    fine = counts[len(mech.round_one_ends):]
    return noise + seen + hidden_miss(fine, mech.fine_ends, knots, mech.noise_variance(1, copies, fine=True), mech.size)


def tree_error(mech, copies: int = 1, whole: bool = False) -> float:
    """The exact error per grid index of the tree that would end the release (averaged over `_SAMPLE`
    prefixes spread over the grid): round two's with round one's counts (and round zero's) reused
    (`merge`; version 9 reuses none: its round-two tree is the whole tree), or with `whole` the whole
    tree's (plan version 6's route). Public: cached per mechanism."""
    key = _key(mech, copies) + (whole,)
    if key not in _TREE_ERRORS and mech.size > MAX_REUSE_GRID:  # exact for the covering estimate, an upper bound
        _TREE_ERRORS[key] = copies * (mech.whole if whole else mech.tree).expected_mse()
    if key not in _TREE_ERRORS:
        at = np.unique(np.linspace(0, mech.size - 2, _SAMPLE).astype(np.int64))  # the last prefix (n) aside
        if whole:
            _TREE_ERRORS[key] = float(np.mean(tree_prefix_variance(mech.whole, at, copies)))
        else:
            merged = reuse_merge(mech, "tree", copies)
            drop = merged.variance_drop(at) if merged is not None else 0.0
            _TREE_ERRORS[key] = float(np.mean(tree_prefix_variance(mech.tree, at, copies) - drop))
    return _TREE_ERRORS[key]


_MERGES: dict[tuple, RoundOneMerge | None] = {}


def _key(mech, copies: int) -> tuple:
    return (mech.size, mech.epsilon, mech.relation, mech.fine, mech.share_rule, mech.plan_version, copies)


def reuse_merge(mech, design: str, copies: int = 1) -> RoundOneMerge | None:
    """The `RoundOneMerge` of the counts a routed release of `design` reuses (`reuse_parts`) into its
    tree; None when there are none, or on grids above `MAX_REUSE_GRID`. Public parameters only: cached."""
    if mech.size > MAX_REUSE_GRID:
        return None
    key = _key(mech, copies) + (design,)
    if key not in _MERGES:
        if len(_MERGES) >= 32:
            _MERGES.clear()
        parts, scales = mech.reuse_parts(design)
        tree = mech.whole if design == "whole" else mech.tree
        _MERGES[key] = RoundOneMerge(tree, tuple(parts), tuple(dlaplace_variance(t) for t in scales), copies) if parts else None
    return _MERGES[key]
