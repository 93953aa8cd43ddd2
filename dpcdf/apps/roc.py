"""DP ROC curves and AUC (the paper's section 5.1) from two DP ECDFs: of the positives' scores and of
the negatives' scores.

Convention (scikit-learn's): a score at or above the threshold predicts positive. On the grid, the
threshold t_i predicts positive for index(score) >= i, so TPR_i = #{positives with index >= i} / P.

Privacy: each person is in exactly one of the two ECDFs, and each curve is released epsilon/2-DP
under add/remove. A substitution (one person's score and label change) is one removal and one
addition, either both in one curve (2 x epsilon/2) or one in each (epsilon/2 + epsilon/2): together
epsilon-DP under substitution (n public; P and N are not, so they are estimated from the curves).
The two curves draw their node noise from separate id domains, so a deterministic noise function
(like the servers' PRF) never gives both the same noise, which would cancel in their difference.

Under zCDP (`privacy="zcdp", rho=...`, as `release_ecdf` takes it) each curve is the discrete
Gaussian tree at rho/2 under add/remove (Delta2 = 1 per level, the root noised), with the exact
discrete Gaussian from the OS CSPRNG (centrally) or each server's PRF. One person joining or leaving
changes one curve: rho/2-zCDP under add/remove. A substitution moves a value within one curve (L2
squared sensitivity 2 per level, twice the add/remove one: 2 x rho/2) or across the two (rho/2 +
rho/2): rho-zCDP under substitution, which implies (rho + 2 sqrt(rho log(1/delta)), delta)-DP for any
delta in (0, 1). `RocRelease.statement` states the exact rational accounting of the two curves.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import ParameterError
from ..release.grid import Grid
from ..release.ecdf import Release, release_ecdf, secure_node_noise
from ..release.mechanisms import Mechanism, TreeMechanism
from ..release.payload import Payload
from ..release.policy import auto_mechanism, check_budget, curve_budget
from ..release.zcdp import ZcdpAccounting, gaussian_tree, zcdp_to_dp

if TYPE_CHECKING:
    from ..service.client.analyst import Analyst


@dataclass(frozen=True)
class RocRelease:
    thresholds: np.ndarray  # grid thresholds, then +inf (nothing predicted positive)
    fpr: np.ndarray
    tpr: np.ndarray
    positives: Release
    negatives: Release
    epsilon: float | None  # the budget under pure DP (None under zCDP)
    rho: float | None = None  # the budget under zCDP

    @property
    def auc(self) -> float:
        """Area under the (monotone) curve by the trapezoid rule."""
        order = np.lexsort((self.tpr, self.fpr))  # by FPR, and up the vertical steps
        return float(np.trapezoid(self.tpr[order], self.fpr[order]))

    def band(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(fpr_lo, fpr_hi, tpr_lo, tpr_hi) at each of `thresholds`: each curve's simultaneous band at
        level 1 - (1 - level) / 2 (`Release.confidence_band`, the data's own ECDF), read as `rates` reads
        the curve (a rate at t_i is 1 - F(t_(i-1))), so that with probability at least `level` over the
        noise the data's own (FPR, TPR) lies in its box at every threshold at once (a union bound over
        the two curves). Post-processing of the release: no privacy cost."""
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
            raise ParameterError(f"level must lie strictly between 0 and 1, got {level!r}")
        out = []
        for rel in (self.negatives, self.positives):
            lo, hi = rel.confidence_band(1 - (1 - level) / 2)
            out += [np.concatenate([[1.0], 1 - hi]), np.concatenate([[1.0], 1 - lo])]
        return out[0], out[1], out[2], out[3]

    @property
    def statement(self) -> str:
        if self.epsilon is not None:  # pure DP (no rho)
            return (f"{self.epsilon:g}-DP under substitution (n public): two ECDFs (positives, negatives), each "
                    f"{self.epsilon / 2:g}-DP under add/remove")
        per_curve = max(_curve_rho(r, "add-remove") for r in (self.positives, self.negatives))
        sub = max(2 * per_curve, max(_curve_rho(r, "substitution") for r in (self.positives, self.negatives)))
        return (f"{float(sub):.6g}-zCDP under substitution (n public; at most rho = {self.rho:g}), {float(per_curve):.6g}-zCDP "
                f"under add/remove: two ECDFs (positives, negatives), each {float(per_curve):.6g}-zCDP under add/remove "
                f"(discrete Gaussian trees); implies ({zcdp_to_dp(float(sub), 1e-6):.4g}, 1e-6)-DP under substitution")


def _curve_rho(release: Release, relation: str) -> Fraction:
    """A zCDP curve's exact rho under `relation` (its mechanism a discrete Gaussian one, calibrated for add/remove)."""
    rho = cast(ZcdpAccounting, release.mechanism).exact_rho(relation)
    assert rho is not None  # (add/remove's calibration: a guarantee under both relations)
    return rho


def rates(release: Release) -> np.ndarray:
    """#{index >= i} / total for i = 0..N (the last one, N, is 0): from the released prefix counts."""
    total = release.total
    c = np.concatenate([[0.0], release.counts])
    return np.clip((total - c) / total, 0.0, 1.0) if total > 0 else np.zeros(c.size)


def roc(scores, labels, grid: Grid, epsilon: float | None = None, mechanism: str | Mechanism = "auto", noise=secure_node_noise,
        privacy: str = "pure", rho: float | None = None) -> RocRelease:
    """The epsilon-DP ROC curve of classifier scores against binary labels, on `grid`, or with
    privacy="zcdp" and `rho` (no epsilon) the rho-zCDP one (each curve a discrete Gaussian tree at rho/2,
    add/remove; mechanism "auto" or "tree", as a zCDP label task's). See the module docstring for the
    privacy statement. Raises ParameterError for NaN scores, labels other than 0/1, data without both
    classes, or a budget release_ecdf would refuse (epsilon with zCDP, rho without it)."""
    budget = check_budget(privacy, epsilon, rho)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1)
    if s.size != y.size or s.size == 0:
        raise ParameterError(f"need as many labels as scores, and some: got {s.size} scores, {y.size} labels")
    if np.isnan(s).any():
        raise ParameterError("scores must not be NaN")
    if not np.isin(y, [0, 1]).all():
        raise ParameterError("labels must be 0 or 1")
    if y.min() == y.max():
        raise ParameterError("a ROC curve needs both classes in the data")
    share, relation = curve_budget(Payload.LABEL, budget, "add-remove")  # the policy table's, as a label task's
    if not isinstance(grid, Grid):
        raise ParameterError(f"grid must be a dpcdf.Grid, got {type(grid).__name__}")
    if mechanism == "auto":
        mechanism = auto_mechanism(grid.size, relation, privacy, share, payload=Payload.LABEL)
    zcdp: dict[str, Any]  # release_ecdf's privacy and rho, under zCDP
    if privacy == "zcdp":
        if mechanism == "tree":  # a zCDP label task's curves (`TaskConfig.make_mechanism`)
            mechanism = gaussian_tree(grid.size, share, relation)
        eps, zcdp = None, dict(privacy="zcdp", rho=share)
    else:
        if mechanism == "tree":  # the plan its tables were made with (no root share; as a label task's)
            mechanism = TreeMechanism(grid.size, share, relation, root_share=0)
        eps, zcdp = share, {}
    pos = release_ecdf(s[y == 1], grid, eps, mechanism, relation, "monotone", noise=_domain(noise, 1), **zcdp)
    neg = release_ecdf(s[y == 0], grid, eps, mechanism, relation, "monotone", noise=_domain(noise, 2), **zcdp)
    pure = privacy == "pure"
    return RocRelease(np.concatenate([grid.thresholds, [np.inf]]), rates(neg), rates(pos), pos, neg,
                      budget if pure else None, None if pure else budget)


def roc_from_servers(analyst: Analyst) -> RocRelease:
    """The DP ROC curve of a two-server label task: element 0 of each key counts positives, element 1
    negatives; both curves are post-processed full-grid releases carrying both servers' noise."""
    if not analyst.config.payload.roc:
        raise ParameterError("this task releases an ECDF: use release()")
    pos, neg = analyst.releases("monotone")  # the plain fit, as the central roc (its tables were made with it)
    return RocRelease(np.concatenate([analyst.grid.thresholds, [np.inf]]), rates(neg), rates(pos), pos, neg,
                      analyst.config.epsilon, analyst.config.rho)


def _domain(noise, k: int):
    """`noise` on node ids with k in their top two bits (node ids stay below 2^62)."""
    return lambda ids, scale: noise(np.asarray(ids).astype(np.uint64) | np.uint64(k << 62), scale)


def l1_area(fpr_a, tpr_a, fpr_b, tpr_b, points: int = 2001) -> float:
    """The paper's ROC error: the area between two ROC curves, integral over FPR of |TPR_a - TPR_b|
    (each curve linearly interpolated, in FPR order)."""
    f = np.linspace(0, 1, points)

    def curve(fpr, tpr):
        order = np.lexsort((tpr, fpr))
        return np.interp(f, np.asarray(fpr)[order], np.asarray(tpr)[order])

    return float(np.trapezoid(np.abs(curve(fpr_a, tpr_a) - curve(fpr_b, tpr_b)), f))
