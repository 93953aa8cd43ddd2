"""The central (trusted-curator) DP ECDF release: the mechanisms on plain counts, then
post-processing. The two-server protocol produces the same kind of `Release` from key shares."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from . import postprocess, smoothing
from ..errors import IntegerGridWarning, ParameterError
from .grid import Grid
from .mechanisms import Mechanism, PathMechanism, TreeMechanism, check_epsilon, check_relation
from .adaptive import AdaptiveMechanism
from .factorization import SqrtFactorizationMechanism, sqrt_factorization
from .noise import secure_noise
from .policy import auto_mechanism
from .zcdp import GaussianTreeMechanism, GaussianVariance, check_rho, gaussian_tree, secure_dgauss

MECHANISMS = ("auto", "path", "tree", "adaptive")
POSTPROCESS = ("auto", "none", "monotone", "monotone-l1", "sparse", "smooth")
SPARSE_TAU, SPARSE_RELATIVE = 1.5, 4.0  # the "sparse" fit's thresholds, in noise sds (data-independent)


def secure_node_noise(node_ids: np.ndarray, scale: Fraction) -> np.ndarray:
    """Fresh CSPRNG noise for each node id (each id must be asked for once per release): DLap(scale),
    or N_Z(0, scale) when the scale is a `zcdp.GaussianVariance`."""
    if isinstance(scale, GaussianVariance):
        return secure_dgauss(np.asarray(node_ids).size, scale)
    return secure_noise(np.asarray(node_ids).size, scale)


@dataclass(frozen=True)
class Release:
    """A DP ECDF over a grid: `raw` are the noisy prefix counts the mechanism released (for a
    tree, the covering estimator), `counts` the post-processed ones (non-decreasing, within
    [0, total]); `total` is n (public under substitution) or its noisy estimate (add/remove).
    Everything here is post-processing of one release, so it costs no further privacy."""

    grid: Grid
    mechanism: Mechanism
    raw: np.ndarray
    counts: np.ndarray
    total: float
    fitted: np.ndarray | None = None  # the best linear estimate before the monotone fit (tree: consistent)
    noise_sd: float = 0.0  # the mechanism's (data-independent) noise sd per prefix count
    copies: int = 1  # independent noises per released value (2 over two servers)
    released: object = field(default=None, repr=False, compare=False)  # the mechanism's release itself (`gather`)

    @property
    def statement(self) -> str:
        return self.mechanism.statement()

    def cdf(self) -> np.ndarray:
        """F at every threshold (post-processed)."""
        return self.counts / self.total if self.total > 0 else np.zeros_like(self.counts)

    def ecdf(self, ts) -> np.ndarray:
        """F(t) for any values t: the released F at the largest threshold <= t (0 below t_0; `read_at`
        names it). Between thresholds t_i < t < t_(i+1) the data's F(t) may be anywhere from F(t_i) to
        F(t_(i+1)) (values in (t_i, t] are counted at t_(i+1)): `confidence_band(ts=...)` spans both."""
        i = self._below(ts)
        f = self.cdf()
        return np.where(i >= 0, f[np.clip(i, 0, None)], 0.0)

    def read_at(self, ts) -> np.ndarray:
        """The threshold each `ecdf(t)` answer reads (the largest <= t; NaN below t_0)."""
        i = self._below(ts)
        return np.where(i >= 0, self.grid.thresholds[np.clip(i, 0, None)], np.nan)

    def _below(self, ts) -> np.ndarray:
        t = np.asarray(ts, dtype=np.float64)
        if np.isnan(t).any():
            raise ParameterError("ecdf points must not be NaN")
        return np.searchsorted(self.grid.thresholds, t, side="right") - 1

    def quantile(self, ps, method: str = "exact") -> np.ndarray:
        """The smallest threshold t with F(t) >= p, per p in [0, 1] (non-decreasing in p, and each
        level's answer does not depend on the other levels asked).

        "exact" inverts the monotone release, except in the tails: for levels p within one noise sd
        (`noise_sd`, data-independent) of 1, the monotone (isotonic) fit of a long flat stretch of the
        grid where F = n is pulled below n by the noise's long-window minima, so it reaches p n far
        too late; there the first index where the unsmoothed estimate `fitted` reaches p n is taken,
        and symmetrically for levels within one sd of 0 the first index after which `fitted` stays
        at or above p n. Middle levels are clipped between those two tail answers, so the result
        stays monotone (when the tails cross, e.g. under very large noise, the plain inverse is
        used). "bisect" is the paper's Algorithm 1 (binary search) on the raw release.
        Post-processing: no extra privacy cost."""
        p = np.asarray(ps, dtype=np.float64)
        if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
            raise ParameterError("quantile levels must lie in [0, 1]")
        if method == "exact":
            idx = self._invert(p.reshape(-1)).reshape(p.shape)
        elif method == "bisect":
            raw = self.raw / self.total if self.total > 0 else self.raw
            idx = np.array([_bisect(raw, q) for q in p.reshape(-1)]).reshape(p.shape)
        else:
            raise ParameterError(f"method must be 'exact' or 'bisect', got {method!r}")
        return self.grid.thresholds[np.minimum(idx, self.grid.size - 1)]

    def _invert(self, p: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.cdf(), p, side="left")
        if self.fitted is None or self.total <= 0 or self.noise_sd <= 0:
            return idx
        band = self.noise_sd / self.total
        if band >= 0.5:
            return idx
        y = np.asarray(self.fitted, dtype=np.float64)
        upper = np.maximum.accumulate(y)  # first crossing of a level
        lower = np.minimum.accumulate(y[::-1])[::-1]  # first index after which y stays at or above a level
        first = lambda q: np.searchsorted(upper, q * self.total, side="left")  # noqa: E731
        last = lambda q: np.searchsorted(lower, q * self.total, side="left")  # noqa: E731
        lo_clip, hi_clip = last(band), first(1 - band)
        if lo_clip > hi_clip:
            return idx
        top, bottom = p > 1 - band, p < band
        mid = np.clip(idx, lo_clip, hi_clip)
        return np.where(top, np.maximum(first(p), hi_clip), np.where(bottom, np.minimum(last(p), lo_clip), mid))

    def histogram(self, edges) -> np.ndarray:
        """DP counts of the bins between consecutive `edges` (values t with a < t <= b), as
        differences of the released ECDF: noise grows with log(bins), not with their number (the
        paper's section 7). Post-processing: no extra privacy cost."""
        e = np.asarray(edges, dtype=np.float64)
        if e.ndim != 1 or e.size < 2 or not np.all(np.diff(e) > 0):
            raise ParameterError("edges must be an increasing 1-D array of at least 2 values")
        return np.diff(self.ecdf(e)) * self.total

    def confidence_band(self, level: float = 0.95, target: str = "sample", ts=None,
                        sims: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) F at the grid's thresholds (or at points `ts`, read as `ecdf` reads them): a
        simultaneous band, P(lower <= F_n <= upper at every threshold) >= level over the mechanism's
        noise, for the data's own ECDF F_n (target="sample"), or, with the DKW bound on alpha / 2
        added, for the CDF of the population the n values were drawn i.i.d. from ("population").
        It accounts for the mechanism's exact noise law (simulated from public parameters: epsilon or
        rho, grid, tree shape, copies; the rank argument makes the level exact) and for monotonicity
        and [0, n] as the monotone fit uses them; it is centred on the release's linear estimate (a
        smoothed release's band is the unsmoothed estimate's). Post-processing: no privacy cost.
        Details and proofs: `dpcdf/release/band.py`."""
        from . import band

        return band.confidence_band(self, level, target, ts, band.DEFAULT_SIMS if sims is None else sims)

    def plot(self, ax=None, band: float | None = 0.95, target: str = "sample", label: str | None = None):
        """Draw the released ECDF and (unless band is None) its simultaneous band at that level on
        matplotlib axes (a new figure when None; matplotlib is imported only here); returns the axes."""
        from .band import plot_band

        return plot_band(self, ax, band, target, label)

    def smooth(self, p: int = 2) -> "Release":
        """The paper's eq. 3: the smallest node-noise adjustments (L1 or L2) that make the raw path
        release non-decreasing within [0, n]. Path mechanism only (its node sets are paths; trees are
        made consistent instead): ParameterError for a tree."""
        nodes = self.mechanism.smoothing_nodes()
        counts = postprocess.smooth_eq3(self.raw, nodes, self.total, p)
        return replace(self, counts=counts)


def _bisect(raw: np.ndarray, p: float) -> int:
    lo, hi = 0, raw.size - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if raw[mid] < p:
            lo = mid + 1
        else:
            hi = mid
    return lo


def quantiles(values, grid: Grid, epsilon: float, ps=(0.1, 0.25, 0.5, 0.75, 0.9), **release_args) -> np.ndarray:
    """A DP quantile summary: the release's exact inverse at levels `ps` (epsilon-DP as the release)."""
    return release_ecdf(values, grid, epsilon, **release_args).quantile(ps)


def prefix_counts(values, grid: Grid) -> np.ndarray:
    """Exact counts #{v : index(v) <= i} at every grid index."""
    idx = grid.index(values)
    return np.cumsum(np.bincount(idx.reshape(-1), minlength=grid.size)).astype(np.int64)


def release_ecdf(
    values,
    grid: Grid,
    epsilon: float | None = None,
    mechanism: str | Mechanism = "auto",
    relation: str = "substitution",
    postprocess_with: str = "auto",
    noise=secure_node_noise,
    privacy: str = "pure",
    rho: float | None = None,
) -> Release:
    """An epsilon-DP ECDF of `values` on `grid` (trusted curator: the caller holds the data).

    mechanism: "path" (the paper's eq. 2 with exact calibration), "tree" (the b-ary tree with the
    least expected error for this grid, made consistent), "adaptive", "factorization" (zCDP), "auto"
    (the policy table's choice, `dpcdf/release/policy.py`), or a mechanism object.
    relation: which neighbouring datasets the guarantee covers ("substitution": one value changes
    and n is public; "add-remove": one person joins or leaves). The returned `Release.statement`
    says the guarantee. Raises ParameterError for bad epsilon, no data, or unknown names.
    privacy="zcdp" with `rho` (and no epsilon): rho-zCDP with exact discrete Gaussian noise, mechanism
    "auto" (the square-root factorization on grids of up to 2^13 points, `factorization`, else the
    binary tree), "factorization", "tree" (`zcdp.GaussianTreeMechanism`), or such an object."""
    relation = check_relation(relation)
    if privacy == "zcdp":
        if epsilon is not None:
            raise ParameterError("privacy='zcdp' takes rho, not epsilon")
        mech = _zcdp_mechanism(mechanism, grid, check_rho(rho), relation)
    elif privacy == "pure":
        if rho is not None:
            raise ParameterError("rho is for privacy='zcdp'")
        epsilon = check_epsilon(epsilon)
        mech = None
    else:
        raise ParameterError(f"privacy must be 'pure' or 'zcdp', got {privacy!r}")
    if not isinstance(grid, Grid):
        raise ParameterError(f"grid must be a dpcdf.Grid, got {type(grid).__name__}")
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        raise ParameterError("need at least one value")
    prefix = prefix_counts(v, grid)
    if grid.shifts_integers(v):
        warnings.warn("the values look like integers and some fall between the grid's thresholds: F(t) at such an "
                      "integer t is read at the threshold below it (Release.read_at); Grid.integers(lo, hi) answers "
                      "each integer exactly", IntegerGridWarning, stacklevel=2)
    if mech is None:
        assert epsilon is not None  # (privacy "pure": checked above)
        tree_fit = postprocess_with not in ("auto", "monotone", "none")  # a tree's post-processing: "auto" is the tree
        mech = _mechanism("tree" if tree_fit and mechanism == "auto" else mechanism, grid.size, epsilon, relation)
    return finish_release(grid, mech, mech.noisy(prefix, noise), v.size, postprocess_with)


def finish_release(grid: Grid, mech: Mechanism, noisy, n: int, postprocess_with: str = "auto", copies: int = 1,
                   refit=None) -> Release:
    """The post-processing every release shares (central, or the analyst's over two servers):
    `noisy` is the mechanism's release (`Mechanism.noisy` / `gather`: the path mechanism's noisy
    prefix counts, the tree's noisy node counts per level), each value carrying `copies` independent
    noises; n is public under substitution. postprocess_with: "auto" (the default: "smooth" for a tree
    release on a grid of up to 2^12 points, else "monotone"), "monotone" (consistent, then the L2
    monotone fit), "monotone-l1", "none", or "sparse" (trees only: the data-adaptive consistent
    fit of `TreeMechanism.consistent` with tau = 1.5, which takes nodes within 1.5 noise sds of zero
    and 4 sds below an even share of their parent as empty, keeping the parent's total; then the
    monotone fit), or "smooth" (trees on grids of up to 2^12 points: the consistent estimate's
    details level by level, each kept inside every node in the proportion its squared size exceeds
    its exact noise variance, `smoothing`; then the monotone fit). All of them are post-processing
    of the one release: no privacy cost. `refit`: a function of the consistent estimate that the
    post-processing starts from instead (an adaptive release's round one reused, `merge`)."""
    if postprocess_with not in POSTPROCESS:
        raise ParameterError(f"postprocess_with must be one of {POSTPROCESS}, got {postprocess_with!r}")
    if isinstance(mech, AdaptiveMechanism):
        return _finish_adaptive(grid, mech, noisy, n, postprocess_with, copies)
    raw, fitted = mech.estimate(noisy, copies)
    fitted = fitted if refit is None else refit(fitted)
    if postprocess_with == "auto":  # smoothing never lost to the plain fit in expectation (paired runs, docs/accuracy.md)
        postprocess_with = "smooth" if isinstance(mech, TreeMechanism) and mech.size <= smoothing.MAX_SMOOTH_GRID else "monotone"
    if postprocess_with == "sparse":  # post-processing of the same release: no privacy cost
        if not isinstance(mech, TreeMechanism):
            raise ParameterError(f"postprocess_with='sparse' needs a tree release, not the {mech.name} mechanism")
        fitted = mech.consistent(noisy, copies, threshold=SPARSE_TAU, relative=SPARSE_RELATIVE)
    to_fit = fitted
    if postprocess_with == "smooth":  # post-processing of the same release: no privacy cost
        to_fit = smoothing.smooth(mech, fitted, copies)
    substitution = mech.relation == "substitution"
    total = float(n) if substitution else float(max(fitted[-1], 1.0))
    sd = float(np.sqrt(mech.expected_mse() * copies))
    if postprocess_with == "none":
        return Release(grid, mech, raw, raw, total, raw, sd, copies, noisy)
    known_last = total if substitution else None  # every value is <= t_max (clamped or refused)
    counts = postprocess.monotone(to_fit, 0.0, total, 1 if postprocess_with == "monotone-l1" else 2, known_last)
    return Release(grid, mech, raw, counts, total, fitted, sd, copies, noisy)


def _finish_adaptive(grid: Grid, mech: AdaptiveMechanism, release, n: int, postprocess_with: str, copies: int) -> Release:
    """An adaptive release: its round-two tree's as any tree's, a round-two histogram by `mech.counts`
    ("auto": empty bins dropped, PCHIP where the plan says; "monotone": the plain fit, linear)."""
    if postprocess_with not in ("auto", "monotone", "none"):
        raise ParameterError(f"an adaptive release is post-processed 'auto', 'monotone' or 'none', not {postprocess_with!r}")
    if release.plan.design in ("tree", "whole"):
        tree = mech.route_tree(release)
        return replace(finish_release(grid, tree, release.round_two, n, postprocess_with, copies, mech.reuse(release, copies)),
                       mechanism=mech, released=release)
    raw, counts, total = mech.counts(release, n, "monotone" if postprocess_with == "none" else postprocess_with, copies)
    return Release(grid, mech, raw, raw if postprocess_with == "none" else counts, total, copies=copies, released=release)


def _zcdp_mechanism(mechanism, grid: Grid, rho: float, relation: str):
    if isinstance(mechanism, (GaussianTreeMechanism, SqrtFactorizationMechanism)):
        if mechanism.rho != rho or mechanism.relation != relation or mechanism.size != getattr(grid, "size", None):
            raise ParameterError("the mechanism's rho, relation and size must be the release's")
        return mechanism
    if not isinstance(grid, Grid):
        raise ParameterError(f"grid must be a dpcdf.Grid, got {type(grid).__name__}")
    if mechanism == "auto":
        mechanism = auto_mechanism(grid.size, relation, "zcdp")
    if mechanism == "factorization":
        return sqrt_factorization(grid.size, rho, relation)
    if mechanism == "tree":
        return gaussian_tree(grid.size, rho, relation)
    raise ParameterError("privacy='zcdp' needs mechanism 'auto', 'factorization', 'tree', a GaussianTreeMechanism "
                         f"or a SqrtFactorizationMechanism, got {mechanism!r}")


def _mechanism(mechanism, size: int, epsilon: float, relation: str):
    if isinstance(mechanism, Mechanism):
        if mechanism.size != size:
            raise ParameterError(f"mechanism is for {mechanism.size} grid points, the grid has {size}")
        if mechanism.relation != relation or mechanism.epsilon != epsilon:
            raise ParameterError("the mechanism's epsilon and relation must be the release's")
        return mechanism
    if mechanism == "auto":
        mechanism = auto_mechanism(size, relation, "pure", epsilon)
    if mechanism == "path":
        return PathMechanism(size, epsilon, relation)
    if mechanism == "adaptive":
        return AdaptiveMechanism(size, epsilon, relation)
    if mechanism == "tree":
        return TreeMechanism(size, epsilon, relation)
    raise ParameterError(f"mechanism must be one of {MECHANISMS} or a mechanism object, got {mechanism!r}")
