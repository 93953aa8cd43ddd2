"""The DP Hosmer-Lemeshow statistic (the paper's section 5.2 and Algorithm 2).

Phase 1 (budget share `split` of epsilon): the ECDF of the predicted probabilities on a grid over
[0, 1]; the group boundaries are its quantiles at q / groups. Phase 2 (the rest): per group, the
number of people n_q, the observed positives O_q = sum y and the expected positives E_q = sum p, each
as a vector over groups with discrete Laplace noise, the probabilities in fixed point (2^-16). With the
boundaries fixed, one person is in one group: a substitution changes each vector in at most two
groups by at most one unit (2^16 for E), so each of the three vectors gets a third of phase 2's budget
with sensitivity 2 (2^17). The whole release (boundaries, n_q, O_q, E_q and H) is epsilon-DP under
substitution (n public). H = sum_q (O_q - E_q)^2 / E_q + (O0_q - E0_q)^2 / E0_q with O0 = n_q - O_q,
E0 = n_q - E_q; its p-value is the chi-square tail with groups - 2 degrees of freedom. That p-value reads
the noisy H as if it were exact, and at small epsilon the noise alone makes it reject calibration (75% of
calibrated data sets at epsilon 1, n = 20000); `noise_aware_p_value` simulates the noisy release under
calibration and keeps the test's level.

Under zCDP (`privacy="zcdp", rho=...`, as `release_ecdf` takes it): phase 1 is the discrete Gaussian
tree at split * rho (substitution), phase 2 three vectors of exact discrete Gaussian noise, each at
(1 - split) rho / 3 with L2 squared sensitivity 2 (2 * 2^32 for E; `calibration.group_scales`). zCDP
composes additively (adaptively too: the boundaries are post-processing of phase 1), so the whole
release is rho-zCDP under substitution (n public), which implies (rho + 2 sqrt(rho log(1/delta)),
delta)-DP for any delta in (0, 1).
"""
from __future__ import annotations

import math
import numbers
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from ..errors import ParameterError
from ..release.grid import Grid
from ..release.calibration import FRACTION_BITS, fixed_point, group_scales
from ..release.ecdf import release_ecdf, secure_node_noise
from ..release.payload import Payload
from ..release.policy import check_budget, curve_budget
from ..release.zcdp import GaussianVariance, dgauss_variance, zcdp_to_dp

if TYPE_CHECKING:
    from ..service.client.analyst import Analyst


@dataclass(frozen=True)
class HosmerLemeshow:
    statistic: float
    p_value: float  # chi-square(groups - 2 - dropped) tail at `statistic`, as if it were H
    noise_aware_p_value: float  # the one to decide with at small epsilon: `noise_aware_p_value`
    boundaries: np.ndarray  # groups + 1 edges, 0 and 1 included
    counts: np.ndarray  # n_q (noisy)
    observed: np.ndarray  # O_q (noisy)
    expected: np.ndarray  # E_q (noisy)
    dropped: int  # groups left out of H because a noisy denominator was not positive
    statement: str


def statistic(counts, observed, expected) -> tuple[float, int]:
    """H from per-group n, O, E; groups whose E or n - E is not positive are left out (and counted)."""
    terms, ok = _terms(*(np.asarray(a, dtype=np.float64) for a in (counts, observed, expected)))
    return float(terms.sum()), int((~ok).sum())


def _terms(n: np.ndarray, o: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """H's per-group terms (groups on the last axis), 0 where E or n - E is not positive."""
    e0, o0 = n - e, n - o
    ok = (e > 0) & (e0 > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = (o - e) ** 2 / e + (o0 - e0) ** 2 / e0
    return np.where(ok, terms, 0.0), ok


def noise_aware_p_value(h: float, counts, expected, scales, copies: int = 1, draws: int = 2000) -> float:
    """P(H* >= h), H* the statistic of simulated releases under calibration: per group O* ~ Binomial(n,
    E / n) around the released n and E, then fresh Laplace noise of the release's scales (`copies`
    servers' worth) on n, O and E (normal noise of the discrete Gaussian's variance for zCDP's
    `GaussianVariance` scales). Without noise this reference is the law of H for labels drawn from
    the probabilities (about chi-square(groups), more conservative than the groups - 2 that holds for a
    model fitted on the same data). Post-processing of released values, so no privacy role: the
    simulation uses numpy's generator (seeded from the OS)."""
    rng = np.random.default_rng(secrets.randbits(128))
    n = np.maximum(np.round(np.asarray(counts, dtype=np.float64)), 1.0)
    e = np.clip(np.asarray(expected, dtype=np.float64), 0.0, n)
    gaussian = all(isinstance(t, GaussianVariance) for t in scales)
    t_n, t_o, t_e = (math.sqrt(dgauss_variance(float(t))) if gaussian else float(t) for t in scales)  # sd, or scale
    t_e /= 1 << FRACTION_BITS

    def noisy(value, t):
        if gaussian:
            return value + rng.normal(0.0, t * math.sqrt(copies), (draws, n.size))
        return value + sum(rng.laplace(0.0, t, (draws, n.size)) for _ in range(copies))

    o = rng.binomial(n.astype(np.int64), e / n, size=(draws, n.size))
    terms, _ = _terms(noisy(n, t_n), noisy(o, t_o), noisy(e, t_e))
    return float((1 + np.sum(terms.sum(axis=1) >= h)) / (draws + 1))


def hosmer_lemeshow(probabilities, labels, epsilon: float | None = None, groups: int = 10, bits: int = 10,
                    split: float = 0.5, noise=secure_node_noise, privacy: str = "pure",
                    rho: float | None = None) -> HosmerLemeshow:
    """The epsilon-DP Hosmer-Lemeshow statistic of predicted probabilities against binary labels, or
    with privacy="zcdp" and `rho` (no epsilon) the rho-zCDP one (module docstring). Raises
    ParameterError for probabilities outside [0, 1] or NaN, labels other than 0/1, fewer than 3
    groups, a budget split outside (0, 1), or a budget release_ecdf would refuse."""
    epsilon = check_budget(privacy, epsilon, rho)  # epsilon, or rho under zCDP
    p, y = check_inputs(probabilities, labels, groups)
    if not 0 < split < 1:
        raise ParameterError(f"split must lie in (0, 1), got {split!r}")
    grid = Grid.uniform(0.0, 1.0, bits)
    eps, relation = curve_budget(Payload.CALIBRATION, epsilon, "substitution", split)  # the policy table's
    budget = dict(epsilon=eps) if privacy == "pure" else dict(privacy="zcdp", rho=eps)
    ecdf = release_ecdf(p, grid, mechanism="tree", relation=relation, postprocess_with="monotone", noise=noise,
                        **budget)  # as the two servers' calibration task
    inner = ecdf.quantile(np.arange(1, groups) / groups)
    group = np.clip(np.searchsorted(inner, p, side="left"), 0, groups - 1)  # p <= edge q -> group q
    sums = np.stack([np.bincount(group, minlength=groups), np.bincount(group, weights=y, minlength=groups),
                     np.bincount(group, weights=fixed_point(p), minlength=groups)]).astype(np.int64)
    ids = np.arange(groups, dtype=np.uint64)
    scales = group_scales(epsilon, split, privacy)
    noisy = np.stack([sums[k] + noise(ids + np.uint64((k + 1) << 32), scale) for k, scale in enumerate(scales)])
    return from_group_sums(noisy, np.concatenate([[0.0], inner, [1.0]]), epsilon, split, privacy=privacy)


def hosmer_lemeshow_from_servers(analyst: Analyst, groups: int = 10) -> HosmerLemeshow:
    """The DP Hosmer-Lemeshow statistic of a two-server calibration task: group boundaries from the
    released ECDF of the probabilities, then the servers' noisy group sums (released once per task).
    The same budget split and statement as `hosmer_lemeshow` (pure or zCDP, the task's), with both
    servers' noise."""
    if not analyst.config.payload.scored:
        raise ParameterError("the Hosmer-Lemeshow statistic needs a calibration task")
    grid = analyst.grid
    inner = analyst.release("monotone").quantile(np.arange(1, groups) / groups)  # the plain fit, as the central one
    edges = [int(i) for i in np.minimum(grid.index(inner), grid.size - 2)]
    sums = analyst.group_sums(edges)
    bounds = np.concatenate([[0.0], grid.thresholds[edges], [1.0]])
    config = analyst.config
    return from_group_sums(sums.T, bounds, config.budget, config.split, copies=2, privacy=config.privacy)


def check_inputs(probabilities, labels, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and labels as flat arrays, or ParameterError: probabilities outside [0, 1] or
    NaN, labels other than 0/1, lengths that differ, fewer than 3 groups."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1)
    if p.size == 0 or p.size != y.size:
        raise ParameterError(f"need as many labels as probabilities, and some: got {p.size} and {y.size}")
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ParameterError("probabilities must lie in [0, 1]")
    if not np.isin(y, [0, 1]).all():
        raise ParameterError("labels must be 0 or 1")
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 3:
        raise ParameterError(f"groups must be an int >= 3 (the test has groups - 2 degrees of freedom), got {groups!r}")
    return p, y.astype(np.int64)


def from_group_sums(noisy: np.ndarray, edges: np.ndarray, epsilon: float, split: float, copies: int = 1,
                    privacy: str = "pure") -> HosmerLemeshow:
    """The statistic, its p-values and the statement from noisy per-group (n, O, E fixed point) sums
    carrying `copies` independent noises (2 over the two servers); `epsilon` is rho under zCDP."""
    n_hat, o_hat = noisy[0].astype(np.float64), noisy[1].astype(np.float64)
    e_hat = noisy[2] / float(1 << FRACTION_BITS)
    groups = n_hat.size
    h, dropped = statistic(n_hat, o_hat, e_hat)
    dof = max(groups - 2 - dropped, 1)
    aware = noise_aware_p_value(h, n_hat, e_hat, group_scales(epsilon, split, privacy), copies)
    statement = (f"{epsilon:g}-DP under substitution (n public): {split * epsilon:g} for the ECDF of the probabilities "
                 f"(group boundaries), {(1 - split) * epsilon / 3:g} each for the group counts, observed and expected positives")
    if privacy == "zcdp":  # each part's sigma^2 is rounded up: each spends at most its share
        statement = (f"{epsilon:g}-zCDP under substitution (n public; implies ({zcdp_to_dp(epsilon, 1e-6):.4g}, 1e-6)-DP): "
                     f"{split * epsilon:g} for the ECDF of the probabilities (group boundaries, discrete Gaussian tree), "
                     f"{(1 - split) * epsilon / 3:g} each for the group counts, observed and expected positives (discrete Gaussian)")
    return HosmerLemeshow(h, float(stats.chi2.sf(h, dof)), aware, edges, n_hat, o_hat, e_hat, dropped, statement)


def exact_hosmer_lemeshow(probabilities, labels, boundaries) -> float:
    """The non-private H for given group boundaries (the reference the tests compare with)."""
    p, y = np.asarray(probabilities, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    inner = np.asarray(boundaries)[1:-1]
    group = np.clip(np.searchsorted(inner, p, side="left"), 0, len(boundaries) - 2)
    g = len(boundaries) - 1
    return statistic(np.bincount(group, minlength=g), np.bincount(group, weights=y, minlength=g),
                     np.bincount(group, weights=p, minlength=g))[0]
