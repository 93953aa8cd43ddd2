"""Simultaneous confidence bands for a released ECDF (`Release.confidence_band`), from public
information only: post-processing, no privacy cost.

The guarantee. For `target="sample"` and any fixed data set,

    P( lower_i <= F_n(t_i) <= upper_i for every threshold t_i of the grid ) >= level,

F_n the data's own ECDF (prefix count / n) and the probability over the mechanism's noise (and the
calibration's simulated draws, below). For `target="population"` (the values an i.i.d. sample of n
from some distribution F, F taken on the grid, i.e. of the value as the grid quantises and clamps
it), the band contains F at every threshold with probability >= level over the sampling and the
noise: alpha = 1 - level is split in two halves, the noise band is computed at level 1 - alpha/2 and
widened by the Dvoretzky-Kiefer-Wolfowitz-Massart bound eps_n = sqrt(ln(2 / (alpha/2)) / (2 n)), which
holds with probability >= 1 - alpha/2 for any F; a union bound gives level. (Under add/remove n is not
public: the band's own lower bound on n is used, which is at most n whenever the noise band holds.)

The method, and why. Every mechanism's release is turned into a *linear* estimate y of the prefix
counts (path: the noisy prefixes; tree: the consistent least-squares fit; factorization: L (R x + z)
conditioned on n under substitution; an adaptive release's round-two histogram: its bins conditioned on
n, cumulated, at the bins' ends only), so y - C = A z with z the mechanism's independent noises (exact
discrete Laplace or discrete Gaussian, scales fixed by the mechanism, epsilon or rho and the grid:
public) and A public. The law of the error does not depend on the data. Per threshold error bounds
joined by a union bound over up to 2^16 thresholds would be loose, as the errors are strongly
correlated (neighbouring prefixes share most of their noise); instead the law of the studentised
maximum M = max_i |(A z)_i| / s_i is simulated (s_i the error's sd at i, from a separate pilot
simulation), and h_i = q s_i with q the r-th smallest of `sims` simulated draws of M, r at least
ceil((sims + 1) level) (`rank_quantile`, with the margin below). The release's own M and the
simulated ones are i.i.d., so by the rank argument (as in conformal prediction) P(M <= q) >=
r / (sims + 1) >= level for any number of draws, not only asymptotically.
The simulation draws the exact noise laws (discrete Laplace as the difference of two geometric
variables floor(t E), E exponential; discrete Gaussian by the rejection sampler of Canonne, Kamath
and Steinke 2020 from discrete Laplace proposals), exact up to float64 rounding, from a numpy
generator: these draws are only ever used to calibrate q, a
public number, never added to a release, whose noise stays the exact integer samplers of `noise.py`
and `zcdp.py` (or the servers' PRF noise). The generator is seeded from a hash of the error law's
public parameters, so the same release always gets the same band (the same query asked twice prints
the same answer); then the calibration draws are one fixed pseudo-random set, and the rank carries a
margin of `RANK_MARGIN` = 2 binomial sds (about the level + 0.01 quantile at the default 2,000 draws):
P(M <= q | the draws) >= level unless the draws are among the ~2% of sets whose r-th smallest falls
below the true level-quantile, and over draws and noise together the bound holds exactly. Draws are
cached per error law.

The post-processing actually applied. Given |y_i - C_i| <= h_i at every observed i, the truth C is
non-decreasing, in [0, n], and C_(N-1) = n (every value is at most t_(N-1): clamped or refused), so

    lower_i = max_(j <= i) (y_j - h_j),    upper_i = min_(j >= i) (y_j + h_j)

(clipped to [0, n]) contain C_i at every i: C_i >= C_j >= y_j - h_j for j <= i, and symmetrically.
This is the monotone fit's information (and the [0, n] clipping) used exactly, and it needs no
contraction property of the isotonic regression; it also gives a band where y is not observed (an
adaptive histogram's band between two bin ends runs from the lower bound at the one to the upper bound
at the other: nothing else is known there). Under add/remove F_i = C_i / n with n = C_(N-1) in
[lower_(N-1), upper_(N-1)] on the same event, so F_i lies in [lower_i / upper_(N-1), min(1, upper_i /
lower_(N-1))]. The released curve itself is not the centre: the tree's smoothing (`smoothing.py`,
data-adaptive shrinkage), the sparse fit, the adaptive histogram's empty bins and PCHIP filling are
not linear and have no simple valid bound, so the band is computed from the unsmoothed linear estimate
those are made from (the same release: still post-processing). The released curve usually lies inside
the band but is not guaranteed to. If the noise event fails the two envelopes may cross; there the
bounds are swapped so the band stays an interval (the guarantee is unaffected: it only speaks of the
event). Over two servers each released value carries both servers' noise (`copies` = 2), which the
simulation draws; the servers' PRF noise is taken to have its ideal law.

Adaptive releases: round two's design is chosen from round one's noisy counts, and round two's noise
is independent of round one's, so the band for the design that was chosen holds with probability >=
level conditionally on round one, hence unconditionally. Plan version 9 is the exception on its tree
side: round one is one of the tree's levels, so the tree's noise there is what chose the tree. The band
then holds over both designs together, not given the design: the failure probability is at most
(1 - level) (1 + P(histogram)), and in simulation (10,000 draws a cell on 2^10, eps 1, n = 1,000, by the
review of version 9; not from a table) the tree's band covered 0.9495 and 0.9673 given the tree, 0.9584
and 0.9729 over both designs.
"""
from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ParameterError
from . import plan_error
from .zcdp import GaussianVariance

DEFAULT_SIMS = 2000  # draws of the studentised maximum (the rank argument holds for any number)
PILOT_SIMS = 400  # separate draws for each threshold's error sd (the studentising scale)
RANK_MARGIN = 2.0  # binomial sds added to the calibration's rank (the fixed, seeded draws)
TARGETS = ("sample", "population")
_CELLS = 4_000_000  # floats per simulated chunk (memory)
_CACHE: dict = {}  # (shape key, sims) -> (s, sorted maxima)
_CACHE_MAX = 64


# --- exact noise laws for the calibration (never for a release) --------------------------------------
def _generator(key: tuple | None = None) -> np.random.Generator:
    """A numpy generator for the public calibration's simulation only (never for a release's noise):
    seeded from a hash of the error law's public key, so the same release always gets the same band
    (a query asked twice prints the same answer); from the OS CSPRNG without a key."""
    if key is None:
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    seed = hashlib.sha256(b"dpcdf/band/v1/" + repr(key).encode()).digest()[:16]
    return np.random.Generator(np.random.PCG64(int.from_bytes(seed, "little")))


def _dlaplace(t: float, shape, rng: np.random.Generator) -> np.ndarray:
    """DLap(t): P(k) proportional to exp(-|k| / t), as G1 - G2 with G = floor(t E), E ~ Exp(1), which is
    Geometric on {0, 1, ...}: P(G >= k) = P(E >= k / t) = e^(-k / t)."""
    return np.floor(t * rng.standard_exponential(shape)) - np.floor(t * rng.standard_exponential(shape))


def _dgauss(sigma2: float, shape, rng: np.random.Generator) -> np.ndarray:
    """N_Z(0, sigma2) by CKS 2020's Algorithm 3: a DLap(floor(sigma) + 1) proposal y accepted with
    probability exp(-(|y| - sigma2 / t)^2 / (2 sigma2))."""
    t = math.floor(math.sqrt(sigma2)) + 1
    count = int(np.prod(shape))
    out, filled = np.empty(count), 0
    while filled < count:
        want = int((count - filled) * 1.6) + 16
        y = _dlaplace(t, want, rng)
        keep = y[rng.random(want) < np.exp(-((np.abs(y) - sigma2 / t) ** 2) / (2 * sigma2))]
        take = min(keep.size, count - filled)
        out[filled:filled + take] = keep[:take]
        filled += take
    return out.reshape(shape)


def draw_noise(scale, shape, rng: np.random.Generator, copies: int = 1) -> np.ndarray:
    """`copies` independent noises of the mechanism's law summed (DLap(scale), or N_Z(0, scale) for a
    `GaussianVariance`), float64 of `shape`; for calibration only."""
    shape = tuple(np.atleast_1d(shape))
    one = (lambda: _dgauss(float(scale), shape, rng)) if isinstance(scale, GaussianVariance) \
        else (lambda: _dlaplace(float(scale), shape, rng))
    total = one()
    for _ in range(copies - 1):
        total = total + one()
    return total


# --- the linear estimate of each release and the law of its error ---------------------------------------
@dataclass
class LinearEstimate:
    """y at the `observed` grid indices (the release's linear estimate of the prefix counts) and a
    simulator of its error y - C there (`simulate(rng, draws)` -> (observed, draws)), whose law is
    public; `key` identifies that law for the cache."""

    y: np.ndarray
    observed: np.ndarray
    simulate: Callable[[np.random.Generator, int], np.ndarray]
    key: tuple
    what: str  # which estimate the band is centred on, in words


def linear_estimate(rel) -> LinearEstimate:
    """The linear estimate of a `Release` and its error law (module docstring)."""
    from .adaptive import AdaptiveMechanism
    from .factorization import SqrtFactorizationMechanism
    from .mechanisms import PathMechanism, TreeMechanism

    mech, released, copies = rel.mechanism, rel.released, rel.copies
    if released is None:
        raise ParameterError("this Release does not carry the mechanism's release (made by an older version or by "
                             "hand): a confidence band needs it; make it with release_ecdf or Analyst.release")
    size = rel.grid.size
    every = np.arange(size)
    if isinstance(mech, AdaptiveMechanism):
        if released.plan.design in ("tree", "whole"):
            merged = plan_error.reuse_merge(mech, released.plan.design, copies)
            what = ("the whole tree's" if released.plan.design == "whole" else "the round-two tree's") + " consistent estimate"
            if merged is None:
                return _tree(mech.route_tree(released), released.round_two, copies, what)
            reuse = (merged, mech.reuse_parts(released.plan.design), mech.reused(released))
            return _tree(mech.route_tree(released), released.round_two, copies, what + " with the earlier rounds' counts", reuse)
        return _bins(mech, released, rel.total, copies)
    if isinstance(mech, TreeMechanism):  # the Gaussian tree too
        return _tree(mech, released, copies, "the consistent (least-squares) estimate")
    if isinstance(mech, PathMechanism):
        def simulate(rng, draws):
            return mech.prefix_noise(every, lambda ids, scale: draw_noise(scale, (ids.size, draws), rng, copies))
        return LinearEstimate(np.asarray(released, np.float64), every, simulate,
                              ("path", size, mech.scale, copies), "the noisy prefix counts (eq. 2)")
    if isinstance(mech, SqrtFactorizationMechanism):
        sub = mech.relation == "substitution"

        def simulate(rng, draws):
            z = draw_noise(mech.sigma2, (size, draws), rng, copies)
            return mech.estimate(np.vstack([z, np.zeros((1, draws))]) if sub else z)[1]
        return LinearEstimate(mech.estimate(np.asarray(released, np.float64))[1], every, simulate,
                              ("factorization", size, mech.sigma2, mech.relation, copies),
                              "L (R x + z)" + (", conditioned on n" if sub else ""))
    raise ParameterError(f"no confidence band for the {getattr(mech, 'name', type(mech).__name__)} mechanism")


def _tree(mech, released, copies: int, what: str, reuse=None) -> LinearEstimate:
    """A tree's consistent estimate; with `reuse` = (merge, (parts, scales), counts), merged by least
    squares with the earlier rounds' counts of an adaptive release (plan version 6, `merge`)."""
    levels = mech.released_levels()

    def simulate(rng, draws):
        nodes = []
        for level in range(mech.shape.height + 1):
            k = mech.level_nodes(level)
            if level not in levels:
                nodes.append(np.full((k, draws), np.nan))
            elif mech.scales[level] is None:  # the public root (n)
                nodes.append(np.zeros((k, draws)))
            else:
                nodes.append(draw_noise(mech.scales[level], (k, draws), rng, copies))
        fitted = mech.consistent(nodes, copies)
        if reuse is None:
            return fitted
        (merged, (parts, scales), _) = reuse
        earlier = np.vstack([draw_noise(scale, (len(e), draws), rng, copies) for e, scale in zip(parts, scales)])
        return merged.apply(fitted, earlier)

    y = mech.consistent([np.asarray(v, np.float64) for v in released], copies)
    key: tuple = (type(mech).__name__, mech.size, mech.branching, tuple(mech.scales), tuple(levels), copies)
    if reuse is not None:
        merged, (parts, scales), counts = reuse
        y = merged.apply(y, counts)
        key += ("reused", tuple(len(e) for e in parts), tuple(scales))
    return LinearEstimate(y, np.arange(mech.size), simulate, key, what)


def _bins(mech, released, total: float, copies: int) -> LinearEstimate:
    """A histogram's bins, cumulated, fitted by least squares (`AdaptiveMechanism.fit`): with its split
    groups' totals (plan version 3), conditioned on the public n under substitution, or under add/remove
    with a noisy count of the whole grid (`released.root`); the fit is linear, so its error is the same
    fit of the noises alone (n's excess 0)."""
    ends = np.asarray(released.plan.ends, np.int64)
    sub = mech.relation == "substitution"
    root = None if sub else getattr(released, "root", None)
    split, member = mech.layout(released.plan)[1:]
    bins = mech.fit(released, copies, total if sub else None)[0]

    def simulate(rng, draws):
        if split.any():  # a split group's bins at their scale, the others at theirs, then the groups' totals
            z = np.zeros((ends.size, draws))
            z[member < 0] = draw_noise(mech.scale_two, (int((member < 0).sum()), draws), rng, copies)
            z[member >= 0] = draw_noise(mech.scale_inner, (int((member >= 0).sum()), draws), rng, copies)
            groups = draw_noise(mech.scale_group, (int(split.sum()), draws), rng, copies)
        else:
            z, groups = draw_noise(mech.scale_two, (ends.size, draws), rng, copies), None
        z_root = draw_noise(mech.scale_root, draws, rng, copies) if root is not None else None
        return np.cumsum(mech.fit(released, copies, noise=(z, groups, z_root))[0], axis=0)
    scale_root = mech.scale_root if root is not None else None
    key: tuple = ("bins", ends.size, mech.scale_two, scale_root, mech.relation, copies)
    if split.any():
        key += (mech.scale_inner, mech.scale_group, tuple(member.tolist()))
    return LinearEstimate(np.cumsum(bins), ends, simulate, key,
                          "the round-two histogram's bins" + (" and its split groups' totals" if split.any() else "")
                          + (" conditioned on n" if sub else "")
                          + (" and its count of the whole grid" if root is not None else "") + ", at their ends")


# --- calibration --------------------------------------------------------------------------------------
def _simulated(est: LinearEstimate, draws: int, rng: np.random.Generator, s: np.ndarray | None = None):
    """`draws` errors' per-index sd (s None) or, given s, their studentised maxima."""
    chunk = max(1, _CELLS // max(1, est.observed.size * 4))
    sq, out, done = 0.0, [], 0
    while done < draws:
        m = min(chunk, draws - done)
        e = np.asarray(est.simulate(rng, m), np.float64).reshape(est.observed.size, m)
        if s is None:
            sq = sq + (e**2).sum(axis=1)
        else:
            live = s > 0
            out.append(np.max(np.abs(e[live]) / s[live, None], axis=0) if live.any() else np.zeros(m))
        done += m
    return np.sqrt(sq / draws) if s is None else np.concatenate(out)


def calibration(est: LinearEstimate, sims: int = DEFAULT_SIMS) -> tuple[np.ndarray, np.ndarray]:
    """(s, sorted maxima): each observed index's error sd (from `PILOT_SIMS` draws; 0 where the
    estimate is exact, e.g. n under substitution) and `sims` draws of max_i |error_i| / s_i, sorted.
    Cached per error law."""
    key = (est.key, sims)
    if key not in _CACHE:
        rng = _generator(key)
        s = _simulated(est, PILOT_SIMS, rng)
        s = np.where(s > 1e-9, s, 0.0)
        maxima = np.sort(_simulated(est, sims, rng, s))
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (s, maxima)
    return _CACHE[key]


def rank_quantile(maxima: np.ndarray, level: float, margin: float = RANK_MARGIN) -> float:
    """The r-th smallest of m sorted i.i.d. draws, r = ceil((m + 1) level + margin sqrt((m + 1) level
    (1 - level))) (inf when r > m): a new draw is at most it with probability >= r / (m + 1) >= level
    over all m + 1 draws; the margin (in binomial sds) makes that hold also for the one fixed set of
    draws the seeded calibration uses, but with probability about 2% at 2 sds (module docstring)."""
    m = maxima.size
    r = math.ceil((m + 1) * level + margin * math.sqrt((m + 1) * level * (1 - level)) - 1e-9)
    return math.inf if r > m else float(maxima[max(r, 1) - 1])


# --- the band ----------------------------------------------------------------------------------------
def count_band(rel, level: float, sims: int = DEFAULT_SIMS) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) prefix counts at every threshold, containing the data's prefix counts at all of
    them at once with probability >= level (module docstring)."""
    est = linear_estimate(rel)
    s, maxima = calibration(est, sims)
    q = rank_quantile(maxima, level)
    with np.errstate(invalid="ignore"):
        h = np.where(s > 0, q * s, 0.0) + 1e-6 * np.maximum(1.0, np.abs(est.y))  # float rounding of the fit
    size = rel.grid.size
    lo, hi = np.full(size, -np.inf), np.full(size, np.inf)
    lo[est.observed], hi[est.observed] = est.y - h, est.y + h
    substitution = rel.mechanism.relation == "substitution"
    lo = np.maximum(lo, 0.0)
    if substitution:  # n public: C_(N-1) = n and C <= n
        lo[-1] = hi[-1] = rel.total
        hi = np.minimum(hi, rel.total)
    lower = np.maximum.accumulate(lo)
    upper = np.minimum.accumulate(hi[::-1])[::-1]
    return np.minimum(lower, upper), np.maximum(lower, upper)


def confidence_band(rel, level: float = 0.95, target: str = "sample", ts=None,
                    sims: int = DEFAULT_SIMS) -> tuple[np.ndarray, np.ndarray]:
    """`Release.confidence_band`: (lower, upper) F at the grid's thresholds (or at the points `ts`,
    read as `Release.ecdf` reads them), simultaneous at `level` for the data's ECDF ("sample") or for
    the population's CDF ("population"); guarantee and method in the module docstring."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ParameterError(f"level must lie strictly between 0 and 1, got {level!r}")
    if target not in TARGETS:
        raise ParameterError(f"target must be one of {TARGETS}, got {target!r}")
    if isinstance(sims, bool) or not isinstance(sims, (int, np.integer)) or sims < 10:
        raise ParameterError(f"sims must be an integer >= 10, got {sims!r}")
    alpha = 1 - level
    noise_level = level if target == "sample" else 1 - alpha / 2
    lower, upper = count_band(rel, noise_level, int(sims))
    if rel.mechanism.relation == "substitution":
        n_low = n_high = float(rel.total)
    else:
        n_low, n_high = float(lower[-1]), float(upper[-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        f_lo = np.where(n_high > 0, lower / n_high, 0.0)
        f_hi = np.where(n_low > 0, upper / n_low, 1.0)
    f_lo, f_hi = np.clip(f_lo, 0.0, 1.0), np.clip(f_hi, 0.0, 1.0)
    f_lo[-1] = f_hi[-1] = 1.0  # every value is at most t_(N-1)
    if target == "population":
        dkw = math.sqrt(math.log(2 / (alpha / 2)) / (2 * n_low)) if n_low >= 1 else math.inf
        f_lo, f_hi = np.clip(f_lo - dkw, 0.0, 1.0), np.clip(f_hi + dkw, 0.0, 1.0)
    if ts is None:
        return f_lo, f_hi
    t = np.asarray(ts, dtype=np.float64)
    if np.isnan(t).any():
        raise ParameterError("band points must not be NaN")
    # between thresholds t_i < t < t_(i+1) the data's F(t) lies between F(t_i) and F(t_(i+1)) (a value in
    # (t_i, t] is counted at t_(i+1)): the band there spans both thresholds' bands, on the same event
    i = np.searchsorted(rel.grid.thresholds, t, side="right") - 1
    on = (i >= 0) & (rel.grid.thresholds[np.clip(i, 0, None)] == t)
    upper = np.clip(np.where(on, i, i + 1), 0, rel.grid.size - 1)
    return np.where(i >= 0, f_lo[np.clip(i, 0, None)], 0.0), np.where(i >= rel.grid.size - 1, 1.0, f_hi[upper])


def plot_band(rel, ax=None, level: float | None = 0.95, target: str = "sample", label: str | None = None):
    """Draw the released ECDF and its band (matplotlib, imported here only); returns the axes."""
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.figure(figsize=(7, 4)).add_subplot()
    t = rel.grid.thresholds
    line = ax.step(t, rel.cdf(), where="post", label=label or "released ECDF")[0]
    if level is not None:
        lo, hi = confidence_band(rel, level, target)
        ax.fill_between(t, lo, hi, step="post", alpha=0.25, color=line.get_color(),
                        label=f"{level:.0%} simultaneous band ({target})")
    ax.set_xlabel("t")
    ax.set_ylabel("F(t)")
    ax.legend(loc="lower right")
    return ax
