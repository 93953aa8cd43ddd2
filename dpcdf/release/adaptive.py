"""A two-round, data-adaptive ECDF release (pure epsilon-DP): `mechanism="adaptive"`.

A b-ary tree spends its budget on every resolution of the grid, which is what sparse, spiky data
needs; on smooth data (the paper's Poisson(3) counts) a histogram of a few bins, linear in between,
is several times more accurate at small epsilon, and on data concentrated in a small part of the
grid (a skewed distribution) a histogram of a few dozen bins placed at equal mass. Which of these
fits the data is itself a question about the data, answered here by a first DP round:

1. (Plan version 9, the default: round one is one level of the whole tree instead, `adaptive_level`.)
   Round one spends `ROUND_ONE_SHARE` of epsilon on the counts of `ROUND_ONE_BINS` equal-width bins,
   and `FINE_SHARE` on `fine_bins` finer ones (about 16 grid points wide): 32 bins cannot see a spike
   narrower than a bin, so a plan from them alone spread it (`fine=False`: the coarse bins alone).
   Under add/remove above eps `SHARE_EPSILON` both shares shrink as SHARE_EPSILON / eps
   (`round_one_shares`, share rule 2): round one's noise stays what planning needed at SHARE_EPSILON,
   and round two gets the rest.
2. From them alone (post-processing), `AdaptiveMechanism.plan` picks round two's design, which spends
   the rest of epsilon (`RoundTwo`):
   - when the bins' spread is what sampling and noise explain ("flat", `flat_statistic`): K
     equal-width bins, K (`FLAT_BINS`) minimising the expected error, sampling n / (6K) plus the noise
     (`bins_noise`; version 5 under substitution: 3 for 1 or 2, `MIN_FLAT_BINS`), linear in between;
   - otherwise K bins at equal mass of round one's monotone cubic (PCHIP) estimate, mixed with a
     uniform share `UNIFORM_SHARE` (so a part round one missed still gets bins), K again minimising the
     expected error, now with round one's estimate for the error inside the bins; up to
     `MAX_PLANNED_BINS` bins (`GRADED_PLANNED_BINS` from version 4, without spikes) they are measured as a histogram and filled in by PCHIP, beyond that
     (spiky data) round two is the default `TreeMechanism` on the whole grid; a fine bin (or pair)
     holding far more than the coarse bins' shape puts there (`refined_ends`: a spike) is cut into
     bins of `REFINED_WIDTH` points, added to that histogram (up to `MAX_REFINED_BINS`, and a fine bin's
     count up to `TREE_SDS` noise sds; beyond: the tree); a coarse bin holding mass between empty ones
     whose fine bins show no spike (their noise at small epsilon: `unplaced`) is cut at the fine bins,
     between round one's own coarse ends (version 4: and the mass plan's in the other coarse bins that
     hold mass, `busy_ends`); (version 4) a mass plan's bins are graded, none more than about `GRADE`
     times as wide as its neighbour (`graded_ends`: round one cannot see a tail of few values);
   - (plan version 3) each run of fine bins so cut is a split group (`RoundTwo.groups`): its total is
     counted too, with `GROUP_SHARE` of a bin's budget (version 5: `GROUP_SHARE_5`), its bins with the rest. Past a spike every prefix
     holds its whole mass, which a sum of its bins' counts carries with each bin's noise; the group's own
     count carries one (5 spikes, 300 paired runs: counts MSE 0.54 to 0.81x version 2's).
3. The estimate (post-processing): each split group's bins fitted to its total by least squares
   (`fit`), less its bins within `INNER_SDS` noise sds of zero (a spike's empty bins); a histogram's
   bins (and groups) within `EMPTY_SDS` noise sds of zero taken as empty (not flat data's equal-width bins), the rest conditioned on n (substitution), cumulated, made monotone, and interpolated.
   Under add/remove from eps `ROOT_EPSILON` (share rule 2) a round-two histogram also counts the whole
   grid with `ROOT_SHARE_TWO` of its budget (`root`), and the kept bins are combined with that count by
   least squares: n is not public, the bins' cumulated noise is a random walk, and past the data's
   support every prefix is the estimate of n. (Rule 2 under add/remove also cuts a light spike, below
   `WIDE_SDS` round-two noise sds, into 8-point bins, not 4: fewer noises in its sum.)

Privacy: epsilon-DP under `relation`, by sequential composition of the two rounds, the second chosen
from the first's output only (adaptive composition of pure DP): a histogram's count vector, for any
partition of the grid, changes by at most 2 in L1 under substitution (one unit leaves a bin and joins
another) and by 1 under add/remove, so DLap(Delta / eps_r) per bin is eps_r-DP (round one's two
partitions compose: eps_1 + eps_fine; a round-two histogram's count of the grid, sensitivity 1 under
add/remove, composes with its bins: eps_bins + eps_root <= eps_2; a unit in a split group moves its
bin's count and its group's, whose DLap scales spend GROUP_SHARE (GROUP_SHARE_5) and the rest of eps_bins, while a
unit elsewhere moves one bin's count at eps_bins: `round_two_scales`, for any groups an analyst names);
the round-two tree is `TreeMechanism`'s guarantee at eps_2. The
exact guarantee is round one's plus the larger of the two round-two designs' (version 9: the larger of the
whole tree's, whose level round one is, and round one's plus the histogram's), each rounded down to a
rational scale, so at most epsilon whichever design the data picks. Over two servers each round is
fixed once per task (`dpcdf.service`): a server answers round one's bins, and one round-two design,
from its own PRF noise, so an analyst cannot spend more; a task pins `fine` (`TaskConfig.fine_bins`),
the plan's rules (`plan_version`, `TaskConfig.adaptive_plan`: 9 since round one is a level of the tree, `adaptive_level`) and the shares' rule (`share_rule`,
`TaskConfig.adaptive_shares`).
Measured against OpenDP and the Sarus methods in docs/accuracy.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import cast

import numpy as np

from ..errors import ParameterError
from . import adaptive_level, plan_error, postprocess
from .adaptive_route import ROUND_ZERO_IDS, ZERO_SHARE, RoutedRelease
from .mechanisms import Answers, BinAnswers, CoordinateAnswers, Mechanism, NodeAnswers, NoiseFn, TreeMechanism, check_relation
from .histogram import (FILLS, UNIFORM_SHARE, bins_noise, equal_width_ends, fill_linear, fill_pchip,  # noqa: F401
                        linear_energy, mass_ends, part_counts)
from .noise import MIN_EPSILON, check_epsilon, dlaplace_variance, scale_fraction
from .adaptive_plan import (FINE_SDS, FLAT_BINS, FLAT_LIMIT, GROUP_SHARE, GROUP_SHARE_5, GROUPED_NARROW_SDS, ISOLATED_SDS,  # noqa: F401
                            MASS_BINS, MAX_PLANNED_BINS, MAX_REFINED_BINS, NARROW_SDS, REFINED_WIDTH, ROUND_ONE_BINS, TREE_SDS,
                            WIDE_SDS, PLAN_RULES, RoundOnePlanner, RoundTwo)

ROUND_ONE_SHARE = 0.15  # of epsilon, for round one's coarse bins
FINE_SHARE = 0.05  # of epsilon, for round one's fine bins (`fine`)
SHARE_EPSILON = 0.5  # share rule 2, add/remove: above this epsilon both shares shrink as SHARE_EPSILON / epsilon
SHARE_RULE = 2  # the round-one shares' rule (`AdaptiveMechanism.share_rule`; a task pins the one it was made with)
ROOT_SHARE_TWO = 0.2  # share rule 2, add/remove: of a round-two histogram's budget, for the count of the whole grid (`root`)
ROOT_EPSILON = 0.5  # ... from this epsilon up (at 0.25 it cost the skewed data 1.12x: too few bins kept for it to pay)
FINE_WIDTH, MAX_FINE_BINS = 16, 256  # fine bins of about 16 grid points: 64 to 256 of them (`fine_bins`)
MIN_ADAPTIVE_GRID = 8 * ROUND_ONE_BINS  # smaller grids: the tree (`auto` picks it)
MIN_ADAPTIVE_EPSILON = MIN_EPSILON / FINE_SHARE * (1 + 1e-9)  # smaller epsilons: the tree (`auto` picks it); where round
# zero spends (add/remove from plan version 6, substitution from 8) `min_adaptive_epsilon`, as its share and the rest's fine
# share must reach MIN_EPSILON
PLAN_VERSION = 9  # the plan's rules (`AdaptiveMechanism.plan_version`; a task pins the one it was made with)
EMPTY_SDS = 4.0  # a round-two bin of a non-flat plan within this many noise sds of zero is taken as empty (flat data's
# equal-width bins never are); 2 before: an empty bin's noise passed 2 sds in 6% of bins and then entered every later prefix
# (measurements in docs/accuracy.md, "Split groups")
RUN_SDS = 3.0  # ... unless its run of such bins (it alone, between kept bins) sums to this many sds above zero: a long
# thin tail's bins, each within EMPTY_SDS, were zeroed (3,000 lognormal values on 2^10, 40 paired runs, counts MSE at eps 0.5, 1: 0.22, 0.23
# under substitution, 0.75, 0.89 under add/remove; two normals 0.76, 0.91; five spikes and skewed data 0.97 to 1.01 in 120 runs)
INNER_SDS = 3.0  # ... and a split group's bin within this many sds of zero, unless all are: a spike's empty bins
# carried noise into its total's fit (the estimate of the group's mass from its bins' sum and its own count); five spikes,
# 100 paired runs, counts MSE at eps 0.1, 0.5, 1: add/remove 0.79, 0.96, 0.68, substitution 0.98, 0.91, 0.82; at n = 10^4
# 0.98, 0.76, 0.67 and 0.73, 0.82, 0.67; skewed and paper data 1.00 to 1.02 (4 sds: 1.09x on five spikes at eps 0.5)
ROUND_ONE_IDS, ROUND_TWO_IDS = 1 << 40, 1 << 41  # noise ids of the rounds' bins: a tree node's id is its index
# below 2^40 at level 0 (grids are smaller) and at least 2^56 above (`tree.LEVEL_SHIFT`), so none is a bin's


@dataclass
class AdaptiveRelease:
    """Both rounds' noisy answers: round one's bin counts, the design they chose, round two's bin
    counts (design "bins") or node counts per level (design "tree")."""

    round_one: np.ndarray
    plan: RoundTwo
    round_two: np.ndarray | list[np.ndarray]
    root: float | None = None  # a round-two histogram's noisy count of the whole grid (`AdaptiveMechanism.root`)
    groups: np.ndarray | None = None  # its split groups' noisy totals (plan version 3: `RoundTwo.groups`)
    zero: np.ndarray | None = None  # round zero's noisy counts (add/remove: of the grid, from plan version 7 of the fine
    # bins; from version 8 under substitution too)


def round_one_shares(epsilon: float, relation: str, rule: int = SHARE_RULE) -> tuple[float, float]:
    """Round one's shares of epsilon, (coarse bins, fine bins): rule 1, `ROUND_ONE_SHARE` and
    `FINE_SHARE` at every epsilon; rule 2 under add/remove, the same up to `SHARE_EPSILON` and beyond
    it both times SHARE_EPSILON / epsilon, so round one's noise stays what it is at SHARE_EPSILON and
    round two gets the rest (`unplaced` keeps rule 1's threshold in counts). Substitution keeps rule
    1's shares: there the shrunk shares planned spikes of 100 to 200 values away (4.4 to 5.2x at eps 1).
    A function of public parameters only."""
    if rule == 1 or relation != "add-remove" or epsilon <= SHARE_EPSILON:
        return ROUND_ONE_SHARE, FINE_SHARE
    return ROUND_ONE_SHARE * SHARE_EPSILON / epsilon, FINE_SHARE * SHARE_EPSILON / epsilon


def split_budget(epsilon: float, share: float) -> tuple[float, float]:
    """(share * epsilon, the rest) as floats whose exact sum is at most epsilon."""
    part = epsilon * share
    rest = epsilon - part
    while Fraction(part) + Fraction(rest) > Fraction(epsilon):
        rest = math.nextafter(rest, 0.0)
    return part, rest


def min_adaptive_epsilon(relation: str = "substitution", plan_version: int = PLAN_VERSION) -> float:
    """The least epsilon the adaptive mechanism (with fine bins) takes: each of its shares at least
    MIN_EPSILON; where round zero spends (add/remove from plan version 6, substitution from 8) its
    `ZERO_SHARE` too, and the fine bins' share of what it leaves (review of version 7: 2e-5 to 5e-5 raised instead of falling back to the tree)."""
    rules = PLAN_RULES[plan_version]
    if not rules.route or (relation != "add-remove" and relation not in rules.screen):
        return MIN_ADAPTIVE_EPSILON
    return max(MIN_EPSILON / ZERO_SHARE, MIN_EPSILON / (FINE_SHARE * (1 - ZERO_SHARE))) * (1 + 1e-9)


def fine_bins(size: int) -> int:
    """Round one's fine bin count on a grid of `size` points: bins of about FINE_WIDTH points, a power
    of two from 2 ROUND_ONE_BINS to MAX_FINE_BINS (so they nest in the coarse bins)."""
    k = 2 * ROUND_ONE_BINS
    while 2 * k <= MAX_FINE_BINS and size // (2 * k) >= FINE_WIDTH:
        k *= 2
    return k


@dataclass
class AdaptiveMechanism(RoutedRelease, RoundOnePlanner, Mechanism):
    """Round one: DLap(Delta / eps_1) on `ROUND_ONE_BINS` equal-width bin counts, eps_1 = 0.15 eps, and
    (`fine`) DLap(Delta / eps_fine) on `fine_bins(size)` ones, eps_fine = 0.05 eps (under add/remove
    both times 0.5 / eps above eps 0.5: `round_one_shares`); round two, chosen from round one (`plan`): DLap(Delta / eps_2)
    on a histogram's bin counts (under add/remove from eps 0.5, DLap(1 / (0.8 eps_2)) on them and
    DLap(1 / (0.2 eps_2)) on the whole grid's count: `root`), or the `TreeMechanism` at
    eps_2 = epsilon - eps_1 - eps_fine (Delta = 2 under substitution, 1 under add/remove).

    Plan version 3 (`GROUP_SHARE`): a split group's total with DLap(Delta / (0.6 eps_bins)) and its bins
    with DLap(Delta / (0.4 eps_bins)), eps_bins the bins' budget (`round_two_scales`; 0.7, 0.3 from version 5).

    Plan version 9 (`adaptive_level`): round one is one level of the whole tree at its own scale, round two
    the tree's other levels or a histogram at epsilon less that level's budget.

    Privacy: epsilon-DP under `relation` (module docstring): eps_1 + eps_fine + the larger of the two round-two
    designs' guarantees (version 9: the larger of the tree's and the level's plus the histogram's), exactly,
    whichever the data picks. Grids of at least `MIN_ADAPTIVE_GRID`
    points; count releases only (one ECDF, no payload columns)."""

    size: int
    epsilon: float
    relation: str = "substitution"
    fine: bool = True  # round one's fine bins too (False: the 32 coarse bins alone, as tasks made before them, with a version below 9)
    # plan_version (older tasks) 1: 2-point spike bins, no `unplaced`; 2: no groups; 3: no graded bins; 4: 60% groups, 1-2 flat bins
    plan_version: int = PLAN_VERSION
    share_rule: int = SHARE_RULE  # 1: round one's shares fixed (tasks made before rule 2; `round_one_shares`)

    name = "adaptive"
    answers_prefixes = False

    def __post_init__(self) -> None:
        self.epsilon = check_epsilon(self.epsilon)
        check_relation(self.relation)
        if self.size < MIN_ADAPTIVE_GRID:
            raise ParameterError(f"the adaptive mechanism needs a grid of at least {MIN_ADAPTIVE_GRID} points, got {self.size}")
        if not isinstance(self.plan_version, int) or isinstance(self.plan_version, bool) or self.plan_version not in PLAN_RULES:
            raise ParameterError(f"the adaptive plan's version is 1 to {max(PLAN_RULES)}, got {self.plan_version!r:.40}")
        least = min_adaptive_epsilon(self.relation, self.plan_version) if self.fine else MIN_EPSILON / ROUND_ONE_SHARE
        if self.epsilon < least:
            raise ParameterError(f"the adaptive mechanism needs epsilon >= {least:.3g} under {self.relation} (each share "
                                 f"at least {MIN_EPSILON:g}), got {self.epsilon!r}")
        self.rules = PLAN_RULES[self.plan_version]
        if not isinstance(self.share_rule, int) or isinstance(self.share_rule, bool) or self.share_rule not in (1, 2):
            raise ParameterError(f"the adaptive shares' rule is 1 or 2, got {self.share_rule!r:.40}")
        budget = self.route_budget()  # the rounds' (and the whole tree's) budget: epsilon less round zero's
        delta = TreeMechanism.level_sensitivity(self.relation)
        if self.rules.level_one:  # version 9: round one is a level of the whole tree (`adaptive_level`)
            if not self.fine:
                raise ParameterError("plan version 9's round one is a level of the tree, its fine bins: fine=True")
            self.tree = TreeMechanism(self.size, budget, self.relation)
            self.one_level, self.fine_ends, self.round_one_ends = adaptive_level.layout(self.tree, fine_bins(self.size))
            self.scale_fine = self.scale_one = cast(Fraction, self.tree.scales[self.one_level])  # (a level below the root)
            self.eps_one, self.eps_fine, self.isolated_sds = 0.0, float(delta / self.scale_fine), ISOLATED_SDS
            if Fraction(self.eps_fine) < delta / self.scale_fine:  # the float at or above the level's exact budget
                self.eps_fine = math.nextafter(self.eps_fine, math.inf)
        else:
            one_share, fine_share = round_one_shares(self.epsilon, self.relation, self.share_rule if self.fine else 1)
            self.eps_fine = budget * fine_share if self.fine else 0.0
            self.eps_one = budget * one_share
            self.isolated_sds = ISOLATED_SDS * one_share / ROUND_ONE_SHARE  # rule 1's threshold in counts (`unplaced`)
        self.eps_two = budget - self.eps_one - self.eps_fine
        while Fraction(self.eps_one) + Fraction(self.eps_fine) + Fraction(self.eps_two) > Fraction(budget):
            self.eps_two = math.nextafter(self.eps_two, 0.0)  # the float split's last bit
        if not self.rules.level_one:  # (version 9 set its round one's scale and layout above)
            self.scale_one = scale_fraction(delta, self.eps_one)
            self.scale_fine = scale_fraction(delta, self.eps_fine) if self.fine else None
            self.tree = TreeMechanism(self.size, self.eps_two, self.relation)
            self.round_one_ends = equal_width_ends(self.size, ROUND_ONE_BINS)
            self.fine_ends = equal_width_ends(self.size, fine_bins(self.size)) if self.fine else np.zeros(0, np.int64)
        self.scale_two = scale_fraction(delta, self.eps_two)
        self.root = self.share_rule >= 2 and self.fine and self.relation == "add-remove" and self.epsilon >= ROOT_EPSILON
        self.scale_root = None
        eps_bins = self.eps_two
        if self.root:  # its bins with the rest of eps_two (the tree takes all of eps_two: it has its own root)
            eps_root, eps_bins = split_budget(self.eps_two, ROOT_SHARE_TWO)
            self.scale_two, self.scale_root = scale_fraction(delta, eps_bins), scale_fraction(delta, eps_root)
        self.scale_group = self.scale_inner = self.group_share = None
        if self.fine and self.rules.groups:  # a split group's total, and its bins, share a bin's budget
            self.group_share = self.rules.group_share
            assert self.group_share is not None  # (every plan version with groups gives their share)
            eps_group, eps_inner = split_budget(eps_bins, self.group_share)
            self.scale_group, self.scale_inner = scale_fraction(delta, eps_group), scale_fraction(delta, eps_inner)
        self.whole = TreeMechanism(self.size, budget, self.relation) if self.routed else None
        self.shape = self.tree.shape  # node queries are round two's tree's (or with `whole`, the whole tree's)
        # what a server answers as round one (version 9: the level's nodes alone; the coarse bins are their sums)
        self.round_one_parts = [self.fine_ends] if self.rules.level_one else [self.round_one_ends] + ([self.fine_ends] if self.fine else [])
        self.bins_one = ROUND_ONE_BINS + self.fine_ends.size
        exact = self.exact_epsilon(self.relation)  # (the round-two tree's own relation: a guarantee)
        if exact is None or exact > Fraction(self.epsilon):
            raise AssertionError("the adaptive mechanism's rounds exceed epsilon")

    # --- the plan ----------------------------------------------------------------------------
    def plan(self, round_one: np.ndarray, n: float | None = None, copies: int = 1) -> RoundTwo:
        """Round two's design (`RoundOnePlanner.plan`); from plan version 6 a histogram only where its
        estimated error, times `plan_error.SAFETY`, is below the tree's (`plan_error`), else the tree.
        Version 9 takes round one as the servers answer it (the level's counts) or with its coarse sums first."""
        if self.rules.level_one and np.size(round_one) == self.fine_ends.size:  # version 9: the level's counts, as
            round_one = adaptive_level.with_coarse(round_one, self.fine_ends, self.round_one_ends)  # the servers answer them
        proposal = super().plan(round_one, n, copies)
        if not self.rules.gate or proposal.design == "tree":
            return proposal
        known = float(n) if self.relation == "substitution" and n is not None else None  # (substitution: n given)
        counts = np.asarray(round_one, dtype=np.float64).reshape(-1)
        histogram = plan_error.histogram_error(self, counts, np.asarray(proposal.ends, np.int64), known, copies)
        return proposal if plan_error.SAFETY * histogram < plan_error.tree_error(self, copies) else RoundTwo("tree")

    def noise_variance(self, round_: int, copies: int = 1, fine: bool = False, root: bool = False) -> float:
        """A bin count's noise variance in round one (its coarse bins, or with `fine` its fine ones)
        or two (a histogram's bins, or with `root` its count of the whole grid; `copies` independent noises)."""
        scale = (self.scale_root if root else self.scale_two) if round_ == 2 else self.scale_fine if fine else self.scale_one
        assert scale is not None  # (`root` and `fine` asked of a release that has them)
        if round_ == 1 and not fine and self.rules.level_one:  # version 9: a coarse bin sums its nodes, on average this many
            return copies * dlaplace_variance(scale) * self.fine_ends.size / ROUND_ONE_BINS
        return copies * dlaplace_variance(scale)

    def check_plan(self, plan: RoundTwo) -> RoundTwo:
        """A round-two design as a server must check it before answering: "tree", or "bins" whose
        ends increase strictly, lie on the grid and end at its last index, with `groups` (plan version 3)
        some of those ends ending at the last index (any partition, with any groups, is eps_2-DP:
        `round_two_scales`; a task of an earlier version refuses groups: its config fixed no such scales)."""
        if plan.design == "tree":
            return RoundTwo("tree")
        if plan.design != "bins" or plan.fill not in FILLS:
            raise ParameterError(f"round two is 'bins' (fill 'linear' or 'pchip') or 'tree', got {plan.design!r}/{plan.fill!r}")
        if not all(isinstance(e, (int, np.integer)) and not isinstance(e, (bool, np.bool_)) for e in plan.ends) \
                or not all(0 <= int(e) < self.size for e in plan.ends):
            raise ParameterError(f"round two's bin ends are grid indices in [0, {self.size}), integers")
        ends = np.asarray([int(e) for e in plan.ends], dtype=np.int64)
        if ends.ndim != 1 or ends.size == 0 or ends.size > self.size or ends[-1] != self.size - 1 or ends[0] < 0 \
                or np.any(np.diff(ends) <= 0):
            raise ParameterError(f"round two's bin ends must increase strictly from >= 0 to {self.size - 1}")
        try:
            groups = () if plan.groups is None else tuple(plan.groups)
        except TypeError:
            raise ParameterError(f"round two's groups are bin ends (a sequence), got {plan.groups!r:.40}") from None
        if groups and self.scale_group is None:
            raise ParameterError("this task's round two has no split groups (its plan's version is below 3)")
        if groups and not (all(isinstance(e, (int, np.integer)) and not isinstance(e, (bool, np.bool_)) for e in groups)
                           and set(int(e) for e in groups) <= set(ends.tolist()) and list(groups) == sorted(set(groups))
                           and int(groups[-1]) == self.size - 1):
            raise ParameterError(f"round two's groups are some of its bin ends, increasing strictly to {self.size - 1}")
        return RoundTwo("bins", tuple(int(i) for i in ends), plan.fill, tuple(int(i) for i in groups))

    def layout(self, plan: RoundTwo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(group ends, which groups are split, each bin's split group or -1) of a checked "bins" plan:
        a group holding more than one bin is split (its total is counted too); without groups, none."""
        ends = np.asarray(plan.ends, np.int64)
        groups = np.asarray(plan.groups if plan.groups is not None and len(plan.groups) else plan.ends, np.int64)
        of_bin = np.searchsorted(groups, ends)
        split = np.bincount(of_bin, minlength=groups.size) > 1
        return groups, split, np.where(split[of_bin], (np.cumsum(split) - 1)[of_bin], -1)

    def round_two_scales(self, plan: RoundTwo) -> list[Fraction]:
        """The DLap scale of each value round two's histogram answers, in order (`round_two_parts`): a
        bin of a split group `scale_inner`, any other bin `scale_two`; each split group's total
        `scale_group`; then (`root`) the whole grid's count `scale_root`. A value's budget is Delta /
        its scale, and a unit lies in one bin, at most one split group and the grid: Delta /
        scale_two, or Delta / scale_group + Delta / scale_inner, plus Delta / scale_root, at most eps_two."""
        split, member = self.layout(plan)[1:]
        scales = [self.scale_inner if m >= 0 else self.scale_two for m in member] + [self.scale_group] * int(split.sum())
        # each one set: split groups only in a checked plan of a release with their scales, `root` with its own
        return cast("list[Fraction]", scales + [self.scale_root] * self.root)

    # --- the release -------------------------------------------------------------------------
    def bin_noise(self, round_: int, count: int, noise: NoiseFn, plan: RoundTwo | None = None) -> np.ndarray:
        """The noise of a round's `count` bins (round one: its coarse bins, then its fine ones; round
        two: `plan`'s values, `round_two_scales`), from node ids no tree node uses; version 9's round one is
        the tree's level, its node ids and scale."""
        if round_ == 2:
            scales = self.round_two_scales(plan if plan is not None else RoundTwo("bins", tuple(range(count - self.root))))
            if len(scales) != count:
                raise ParameterError(f"round two's plan answers {len(scales)} values, not {count}")
            ids, parts = ROUND_TWO_IDS + np.arange(count, dtype=np.int64), []
            for scale in dict.fromkeys(scales):  # each scale's values at once, in order
                at = np.flatnonzero([t == scale for t in scales])
                parts.append((at, np.asarray(noise(ids[at], scale))))
            out = np.zeros(count, np.result_type(*(z for _, z in parts)))
            for at, z in parts:
                out[at] = z
            return out
        if round_ == 0:  # round zero's counts (`adaptive_route`): n, exact under substitution to version 7; the fine bins'
            k = self.zero_ends.size if self.routed else 0
            if not self.routed or count != k:
                raise ParameterError("round zero is the count of the whole grid (or from plan version 7 under add/remove, 8 "
                                     "under both relations, of round one's fine bins), in a release of plan version 6 to 8 only")
            if self.scale_zero is None:
                return np.zeros(1, np.int64)
            return noise(ROUND_ZERO_IDS + np.arange(k, dtype=np.int64), self.scale_zero)
        if self.rules.level_one:  # version 9: the level's node noise, as the tree's (`adaptive_level`)
            if count != self.fine_ends.size:
                raise ParameterError(f"round one is the {self.fine_ends.size} nodes of the tree's level {self.one_level}")
            return self.tree.node_noise(self.one_level, np.arange(count), noise)
        ids = ROUND_ONE_IDS + np.arange(count, dtype=np.int64)
        out = noise(ids[:ROUND_ONE_BINS], self.scale_one)
        if count <= ROUND_ONE_BINS:
            return out
        assert self.scale_fine is not None  # (round one's fine bins: a release that has them)
        return np.concatenate([out, noise(ids[ROUND_ONE_BINS:], self.scale_fine)])

    def gather(self, prefix_at: Answers | None, nodes_at: NodeAnswers, coordinates_at: CoordinateAnswers | None = None,
               bins_at: BinAnswers | None = None, n=None, copies: int = 1) -> AdaptiveRelease:
        """Round one through `bins_at(1, ends)` (its partitions' ends one after another), the plan,
        then round two through `bins_at(2, ends)` or the tree's `nodes_at(level)`; `n` (a number, or a
        function giving it once round one is answered) and `copies` as `plan` takes them."""
        if bins_at is None:
            raise ParameterError("the adaptive mechanism's release is asked for in bins (bins_at)")
        zero = None
        if self.whole is not None:  # routed, plan version 6: the whole tree on large data (`adaptive_route`)
            if n is None and self.relation == "substitution" and self.scale_zero is not None:  # review of version 8
                raise ParameterError("under substitution a release of plan version 8 is asked with n (public), before "
                                     "round zero, whose counts are noisy there")
            route_n = n
            if self.scale_zero is not None or n is None or callable(n):  # round zero: n, noisy under add/remove
                ends = self.zero_ends
                asked = np.asarray(bins_at(0, ends), dtype=np.float64).reshape(-1)
                if asked.size != ends.size or not np.isfinite(asked).all():
                    raise ParameterError(f"round zero has {ends.size} counts, got shape {asked.shape}")
                zero = asked if self.scale_zero is not None else None  # v6, v7 under substitution n, exact: nothing to merge
                if zero is None:
                    route_n = float(asked.sum())
                elif self.relation == "substitution":  # v8: n is public (given: above), round zero's counts screen
                    route_n = float(n() if callable(n) else n)
                else:
                    route_n = self.zero_n(asked, copies)
                n = n if n is not None or zero is not None else route_n  # ... which plans round two too
            if self.take_whole(route_n, copies) or (zero is not None and self.screened(zero, copies)):
                whole = self.whole.gather(prefix_at, lambda level: nodes_at(level, whole=True))
                return AdaptiveRelease(np.zeros(0), RoundTwo("whole"), whole, zero=zero)
        answers = sum(e.size for e in self.round_one_parts)
        one = np.asarray(bins_at(1, np.concatenate(self.round_one_parts)), dtype=np.float64)
        if one.ndim != 1 or one.size != answers or not np.isfinite(one).all():
            raise ParameterError(f"round one has {answers} bin counts of one ECDF, got shape {one.shape}")
        if self.rules.level_one:  # version 9: its coarse bins are sums of the level's nodes (`adaptive_level`)
            one = adaptive_level.with_coarse(one, self.fine_ends, self.round_one_ends)
        total = n() if callable(n) else n
        plan = self.plan(one, total if self.relation == "substitution" else None, copies)
        if plan.design == "tree":
            level_nodes = nodes_at
            if self.rules.level_one:  # round one's answers are the level's: never asked (central noise: drawn) twice
                def level_nodes(level: int, whole: bool = False) -> np.ndarray:
                    return one[ROUND_ONE_BINS:].copy() if level == self.one_level else nodes_at(level)
            return AdaptiveRelease(one, plan, self.tree.gather(prefix_at, level_nodes), zero=zero)
        groups = (np.asarray(plan.groups, np.int64),) if plan.groups else ()  # (a `bins_at(round, ends)` without groups too)
        two = np.asarray(bins_at(2, np.asarray(plan.ends), *groups), dtype=np.float64)
        k, split = len(plan.ends), int(self.layout(plan)[1].sum())
        if two.shape != (k + split + self.root,) or not np.isfinite(two).all():
            raise ParameterError(f"round two has {k + split + self.root} finite bin counts of one ECDF, got shape {two.shape}")
        return AdaptiveRelease(one, plan, two[:k], float(two[-1]) if self.root else None, two[k:k + split] if split else None, zero)

    def round_two_parts(self, plan: RoundTwo) -> list[tuple[np.ndarray, np.ndarray | slice]]:
        """What round two's histogram counts (a server's answer, one after another), as (a partition's
        ends, an index of the bins it answers): its bins, its split groups (plan version 3), then
        (`root`) the whole grid."""
        groups, split, _ = self.layout(plan)
        parts = [(np.asarray(plan.ends, np.int64), slice(None))] + ([(groups, np.flatnonzero(split))] if split.any() else [])
        return parts + [(np.array([self.size - 1], np.int64), slice(None))] * self.root

    def noisy(self, prefix: np.ndarray, noise: NoiseFn, copies: int = 1) -> AdaptiveRelease:
        """The central release of exact prefix counts with `noise` (which adds `copies` noises to each
        value, e.g. 2 to simulate the two servers: round two is planned knowing that)."""
        prefix = np.asarray(prefix).astype(np.int64)

        def bins_at(round_: int, ends: np.ndarray, groups: np.ndarray | tuple[()] = ()) -> np.ndarray:
            if round_ in (0, 1):
                return part_counts(prefix[ends], ends) + self.bin_noise(round_, len(ends), noise)
            plan = RoundTwo("bins", tuple(int(e) for e in ends), groups=tuple(int(e) for e in groups))
            counts = np.concatenate([part_counts(prefix[e], e)[s] for e, s in self.round_two_parts(plan)])
            return counts + self.bin_noise(2, counts.size, noise, plan)

        def nodes_at(level: int, whole: bool = False) -> np.ndarray:
            tree = self.whole if whole else self.tree
            assert tree is not None  # (`whole` asked of a routed release only)
            return tree.central_nodes(prefix, noise)(level)

        return self.gather(None, nodes_at, None, bins_at, int(prefix[-1]), copies)

    def counts(self, release: AdaptiveRelease, n: float, postprocess_with: str = "auto", copies: int = 1) -> tuple[np.ndarray, np.ndarray, float]:
        """(raw, counts, total) of a round-two histogram: raw is its bins cumulated, linear in between;
        counts the estimate of the module docstring ("auto"), or without the empty bins and with
        linear filling ("monotone"); total n or its estimate (the bins' sum, with `root` after the
        least-squares combination: each kept bin gets var / (K var + var_root) of the root's excess)."""
        ends = np.asarray(release.plan.ends)
        raw = self.estimate(release, copies)[0]
        substitution = self.relation == "substitution"
        bins, kept = self.fit(release, copies, float(n) if substitution else None, postprocess_with == "auto")
        total = float(n) if substitution else max(float(bins.sum()), 1.0)
        if substitution and not kept.any():
            bins = np.full(bins.size, total / bins.size)
        at_ends = postprocess.monotone(np.cumsum(bins), 0.0, total, 2, total if substitution else None)
        fill = FILLS[release.plan.fill] if postprocess_with == "auto" else fill_linear
        counts = np.clip(np.maximum.accumulate(fill(at_ends, ends, self.size)), 0.0, total)  # exactly monotone (PCHIP rounds)
        return raw, counts, total

    def fit(self, release: AdaptiveRelease, copies: int = 1, n: float | None = None, empty: bool = False,
            noise: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(bins, kept): round two's bin counts by least squares from its noisy answers (post-processing):
        each split group's bins moved by v_in / (m v_in + v_group) of its total's excess over their sum
        (that total then has variance u = 1 / (1 / v_group + 1 / (m v_in))); then the excess of n (given
        under substitution) or of the count of n (`root`, add/remove) over the kept bins' sum shared in
        proportion to each unit's variance (a bin's v, a group's u, spread evenly over its bins), over
        their sum plus v_root. `empty`: first a split group's bin within `INNER_SDS` sds of zero (unless all
        are) is taken as empty (0, not kept; the group's total is fitted to its other bins), then a bin
        within `EMPTY_SDS` sds (unless its run of such bins sums to `RUN_SDS` sds above 0), or a split group's
        total, unless the plan is flat data's ("linear"). `noise`: (bins, groups, root) arrays of (draws of) noise
        instead of the release's answers, fitted the same linear way with n's excess 0 (the band's)."""
        plan = release.plan
        split, member = self.layout(plan)[1:]
        bins, groups, root = (release.round_two, release.groups, release.root) if noise is None else noise
        bins = np.array(bins, dtype=np.float64)
        empty = empty and plan.fill != "linear" and noise is None  # flat data's equal-width bins: none is empty (`EMPTY_SDS`)
        if split.any() and (groups is None or np.shape(groups)[:1] != (int(split.sum()),)):
            raise ParameterError(f"round two's plan has {int(split.sum())} split groups, whose totals the release must carry")
        v, v_in, v_group = (copies * dlaplace_variance(t) if t is not None else np.nan
                            for t in (self.scale_two, self.scale_inner, self.scale_group))
        weight = np.where(member >= 0, np.nan, v)  # each bin's share of its unit's variance
        kept = np.ones(bins.shape, bool)
        for g in range(int(split.sum())):
            at = member == g
            inner = np.abs(bins[at]) > INNER_SDS * np.sqrt(v_in) if empty else None  # released answers only
            if inner is not None and inner.any() and not inner.all():  # its empty bins 0, and its total fitted to the others alone
                dropped = np.flatnonzero(at)[~inner]
                at[dropped], bins[dropped], kept[dropped] = False, 0.0, False
            bins[at] += (np.asarray(groups)[g] - bins[at].sum(axis=0)) * v_in / (at.sum() * v_in + v_group)
            u = 1 / (1 / v_group + 1 / (at.sum() * v_in))
            weight[at] = u / at.sum()
            if empty:
                kept[at] = np.abs(bins[at].sum(axis=0)) > EMPTY_SDS * np.sqrt(u)
        if empty:
            kept[member < 0] = np.abs(bins[member < 0]) > EMPTY_SDS * np.sqrt(v)
            quiet = np.diff(np.concatenate([[0], ((member < 0) & ~kept).astype(np.int8), [0]]))
            for a, b in zip(np.flatnonzero(quiet == 1), np.flatnonzero(quiet == -1)):  # each run of such bins
                kept[a:b] = bins[a:b].sum() > RUN_SDS * np.sqrt(v * (b - a))  # a thin tail, not empty
            bins = np.where(kept, bins, 0.0)
        target = (n if noise is None else 0.0) if self.relation == "substitution" else root if self.root else None
        if target is not None and kept.any():
            v_root = 0.0 if self.relation == "substitution" else self.noise_variance(2, copies, root=True)
            w = np.where(kept, weight.reshape(weight.shape + (1,) * (bins.ndim - 1)), 0.0)
            bins = bins + (np.asarray(target) - bins.sum(axis=0)) * w / (w.sum(axis=0) + v_root)
        return bins, kept

    def elements(self, release: AdaptiveRelease) -> list[AdaptiveRelease]:
        if np.ndim(release.round_one) != 1:
            raise ParameterError("the adaptive mechanism releases one ECDF (a count task), not payload columns")
        return [release]

    def reuse(self, release: AdaptiveRelease, copies: int = 1):
        """From plan version 6, where round two is the tree: the function taking its consistent prefix
        counts to the least-squares estimate from them and round one's counts (`merge`); else None."""
        merged = plan_error.reuse_merge(self, release.plan.design, copies)
        if merged is None:
            return None
        values = self.reused(release)
        assert values is not None  # (a merge only of counts the release reuses)
        return lambda fitted: merged.apply(fitted, values)

    def estimate(self, release: AdaptiveRelease, copies: int = 1) -> tuple[np.ndarray, np.ndarray]:
        if release.plan.design in ("tree", "whole"):
            raw, fitted = self.route_tree(release).estimate(release.round_two, copies)
            reuse = self.reuse(release, copies)
            return raw, fitted if reuse is None else reuse(fitted)
        bins = self.fit(release, copies)[0]  # the split groups and the grid's count by least squares, every bin
        raw = fill_linear(np.cumsum(bins), np.asarray(release.plan.ends), self.size)
        return raw, raw

    # --- the Mechanism interface the rounds do not use -----------------------------------------
    def node_noise(self, level: int, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        return self.tree.node_noise(level, indices, noise)

    def prefix_noise(self, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        raise ParameterError("the adaptive mechanism answers bins and (its round-two tree's) nodes, not prefixes")

    def released_levels(self) -> list[int]:
        return self.tree.released_levels()

    # --- privacy -----------------------------------------------------------------------------
    def exact_epsilon(self, relation: str) -> Fraction | None:
        """Round one's Delta / scale_1 (+ Delta / scale_fine) plus the larger of round two's designs:
        Delta / scale_2 (+ Delta / scale_root with `root`) for a histogram, the tree's own; None when the
        tree has no guarantee under `relation`."""
        tree = self.tree.exact_epsilon(relation)
        if tree is None:
            return None
        delta = TreeMechanism.level_sensitivity(check_relation(relation))
        fine = delta / self.scale_fine if self.scale_fine is not None else 0  # (`fine`)
        root = delta / self.scale_root if self.scale_root is not None else 0  # (`root`)
        bins = delta / self.scale_two
        if self.scale_group is not None and self.scale_inner is not None:  # a unit in a split group: its total and its bin
            bins = max(bins, delta / self.scale_group + delta / self.scale_inner)
        if self.rules.level_one:  # version 9: round one is a level of the tree, whose guarantee counts it already
            return max(fine + bins + root, tree)
        rounds = delta / self.scale_one + fine + max(bins + root, tree)
        if self.whole is None:  # not routed
            return rounds
        whole = self.whole.exact_epsilon(relation)  # (the round-two tree's relation: not None, as `tree`)
        return None if whole is None else self.zero_epsilon(relation) + max(rounds, whole)

    def rounded_budgets(self) -> int:
        if self.rules.level_one:  # version 9: the level's budget is the tree's own
            return max(2 + self.root + (self.scale_group is not None), self.tree.rounded_budgets())
        rounds = 1 + self.fine + max(1 + self.root + (self.scale_group is not None), self.tree.rounded_budgets())
        return rounds if self.whole is None else (self.scale_zero is not None) + max(rounds, self.whole.rounded_budgets())

    def _describe(self) -> str:
        if self.rules.level_one:
            return (f"adaptive (plan version 9): the {self.fine_ends.size} nodes of level {self.one_level} of the b-ary tree "
                    f"with eps {self.eps_fine:.4g} (its own), then the rest of that tree, or a histogram chosen from them "
                    f"with eps {self.eps_two:.4g}")
        fine = f" and {self.fine_ends.size} with eps {self.eps_fine:.4g}" if self.fine else ""
        root = f" (a histogram also counts n with {ROOT_SHARE_TWO:g} of it)" if self.root else ""
        rounds = (f"{ROUND_ONE_BINS} bins with eps {self.eps_one:.4g}{fine}, then a histogram or the b-ary tree "
                  f"chosen from them with eps {self.eps_two:.4g}{root}")
        if self.whole is None:  # not routed
            return f"adaptive: {rounds}"
        screen = self.screens and self.scale_zero is not None
        counts = f"the counts of {self.zero_ends.size} bins" if screen else "a count of n"
        zero = f"{counts} with eps {self.eps_zero:.4g}, then " if self.scale_zero is not None else ""
        large = "on large data or point masses" if screen else "on large data"
        return (f"adaptive (plan version {self.plan_version}): {zero}{large} the b-ary tree with eps "
                f"{self.whole.epsilon:.4g}, else {rounds}")

    def _no_guarantee(self) -> str:
        return self.tree._no_guarantee()

    def expected_mse(self) -> float:
        """The round-two tree's (its design is data-dependent; a histogram is chosen when its error is lower)."""
        return self.tree.expected_mse()
