"""Round two's design from round one's noisy counts alone (post-processing, no privacy cost): the
planning half of `adaptive.AdaptiveMechanism` (module docstring there, step 2), which inherits it.
Each method reads the mechanism's public parameters (grid, scales, ends, rules) through `self`."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ParameterError
from . import postprocess
from .histogram import bins_noise, equal_width_ends, fill_pchip, graded_ends, mass_ends
from .plan_error import interpolation_miss

ROUND_ONE_BINS = 32  # round one's coarse bins
MAX_PLANNED_BINS = 32  # non-flat designs needing more bins measure the whole tree instead
GRADED_PLANNED_BINS = 64  # ... from plan version 4, for a plan at equal mass alone (smooth data at eps 1 under add/remove got the tree: 3,000 values,
# normal, two normals, uniform on a third of 2^10, 40 paired runs, counts MSE 0.50, 0.64, 0.72; lognormal 0.76 with the
# empty test on runs of bins, `adaptive.RUN_SDS`, 1.29 without it; no cell worse), unless round one finds mass it cannot
# place and no spike under add/remove (as in version 3; narrow spikes of sd 2 at n = 3,000 on 2^10, about 190 such releases
# of 2,000 at eps 1 and 0.5 (review): the tree 0.68x and 0.88x of 64 bins with `heavy_ends` under add/remove, 1.52x and
# 1.31x under substitution); beside a spike's cuts the bins at equal mass stay 32 (five spikes at n = 5,000, eps 0.5,
# add/remove, 200 paired runs: 1.37x with 64; sixty spikes lost 1.6 to 2.1x, a set the tree is better on anyway)
REFINED_WIDTH = 4  # round two's bins inside a fine bin that holds a spike (`refined_ends`; 2-point bins sum each spike's
# mass from twice the noises: 5 spikes, 200 paired runs, eps 0.5/1, MSE 633/152 -> 393/99 (substitution), 449/104 -> 314/76)
NARROW_SDS = 1000.0  # ... but 2-point bins in a fine bin holding more round-two noise sds than this (a 4-point
# bin's interpolation error grows with the square of its count: 5 spikes of 6 10^4 values, eps 0.1, 30 runs,
# 37,718 against 19,253; at 2 10^3 values (570 sds at eps 1) 4 points gave 99 against 152)
GROUPED_NARROW_SDS = 400.0  # ... from plan version 3, where a spike's many bins no longer add their noises past it (5 spikes of
# 10^3 values, add/remove, eps 1, about 500 sds: 300 paired runs, counts MSE 0.80x; at eps 0.5 and under substitution 1.00x)
WIDE_SDS = 150.0  # ... and (share rule 2, add/remove) 8-point bins in one holding fewer than this (a spike's mass is
# summed from half the noises: 5 spikes of 2 10^3 values, eps 0.1, 150 paired runs, 7,117 -> 5,003; at 10^3 values and
# eps 0.5, about 200 sds, 8 points cost 1.55x)
MAX_REFINED_BINS = 1024  # a refined design with more bins measures the whole tree instead
TREE_SDS = 1e4  # ... and so does one whose largest fine bin holds this many round-two noise sds (its small
# bins' interpolation error grows with the square of their counts: 5 spikes of 2 10^5 values, sd 2, on 2^12)
ISOLATED_SDS = 8.0  # a coarse bin (or pair) this many sds heavy between bins within 2 sds of 0: unplaced mass (`unplaced`)
FINE_SDS = 4.0  # a fine bin holds a spike when its count is this many noise sds (and twice) above the coarse shape's
GRADE = 3.0  # plan version 4: a mass plan's bins at most about this many times as wide as a neighbour (`graded_ends`;
# skewed data, 100 paired runs, eps 0.1, 0.5, 1: counts MSE add/remove 0.83, 0.92, 0.93, substitution 0.49, 0.81, 1.00,
# quantile error at eps 0.1 3.09 -> 1.51 and 3.55 -> 2.30; ratio 2 cost lognormal data 1.11x at eps 0.1; grading
# the spikes' plans too cost skewed data 1.22x and five spikes 1.34x in some cells, 60 paired runs)
GROUP_SHARE = 0.6  # plan version 3: of a split group's budget, for its total (`split_groups`; its bins get the rest)
GROUP_SHARE_5 = 0.7  # ... from plan version 5 (five spikes at n = 5,000 on 2^12, paired runs, counts MSE at eps 0.1, 0.5, 1:
# add/remove 0.90, 0.92, 0.84 (300, 200, 200 runs), substitution 0.99, 1.00, 0.91 (200); at n = 10^3 under add/remove 1.00,
# 0.91, 1.02 (100); narrow spikes on 2^10, 60 runs, 1.04, 1.13, 1.00 and -, 0.95, 0.99; 0.8 cost 1.28x at eps 1, add/remove)
POWER_BINS = (1, 2, 4, 8, 16, 32, 64, 128)  # flat data's bin counts before plan version 3
FLAT_BINS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # ... and since: the error is flat near its least
MIN_FLAT_BINS = 3  # plan version 5, substitution: flat data's plan of 1 or 2 bins gets this many instead. At small epsilon
# round one cannot tell data spread over the whole grid from a smooth bump or a few narrow spikes (what 1 bin misses was
# estimated with an sd of 146,000 against the paper's 370 at eps 0.1), and 1 or 2 bins spread such data over the grid:
# 3,000 values on 2^10, eps 0.1, 40 paired runs, counts MSE normal 0.41x, two normals 0.55x, uniform on a third 0.52x, five
# narrow spikes 0.56x; data spread evenly pays about 1.15x (five draws, 150 paired runs each, 0.92 to 1.47x; 0.99 and 1.00x
# at eps 0.5 and 1). The least among 3 or more bins instead jumped to 16 to 32 bins on noise (1.48x). Not under add/remove
# (n unknown, so few bins are not free there; no such shape was found flat at eps 0.1).
MASS_BINS = (8, 16, 32, 64, 128, 256)
FLAT_LIMIT = 1 + 3 * np.sqrt(5 / (ROUND_ONE_BINS - 1))  # 3 sds of flat_statistic on flat data (Laplace noise: Var(z^2) = 5 sd^4)


@dataclass(frozen=True)
class PlanRules:
    """The rules of one plan version (a row of `PLAN_RULES`): a task pins its version, so a server and
    the analyst plan round two alike whatever version is newest. The constants each rule uses are above."""

    refined_width: int  # a spike's bins inside a fine bin (version 1: 2 points; `refined_ends`)
    unplaced: bool  # mass round one cannot place is cut at the fine bins (`unplaced`; from version 2)
    groups: bool  # each cut run of fine bins a split group with its total counted (`split_groups`; from version 3)
    flat_bins: tuple[int, ...]  # flat data's bin counts (`POWER_BINS` before version 3, then `FLAT_BINS`)
    narrow_sds: float  # 2-point spike bins above this many noise sds (`NARROW_SDS`, `GROUPED_NARROW_SDS` from version 3)
    graded: bool  # version 4: graded mass bins (`GRADE`), up to `GRADED_PLANNED_BINS` of them, `busy_ends`,
    # `heavy_ends`, and the tree for unplaced mass alone under add/remove
    group_share: float | None  # a split group's total's share of a bin's budget (`GROUP_SHARE`, `GROUP_SHARE_5`)
    min_flat_bins: int  # under substitution, flat data's fewest bins (`MIN_FLAT_BINS` from version 5)
    gate: bool  # version 6: a histogram only where its estimated error beats the tree's (`plan_error`)
    route: bool  # version 6: the whole tree on large data, round zero under add/remove (`adaptive_route`)
    screen: tuple[str, ...]  # the relations under which round zero counts the fine bins, and data whose point masses no
    # histogram could keep take the whole tree below the route's n too (`adaptive_route.RoutedRelease.screened`):
    # version 7 add/remove, version 8 substitution too (there n is public: round zero's counts are for the screen)
    level_one: bool = False  # version 9: round one is one level of the whole tree at its own budget, which a tree ending the
    # release reuses as it is (`adaptive_level`): no route, no round zero, and the tree costs nothing against itself


PLAN_RULES = {
    1: PlanRules(2, False, False, POWER_BINS, NARROW_SDS, False, None, 1, False, False, ()),
    2: PlanRules(REFINED_WIDTH, True, False, POWER_BINS, NARROW_SDS, False, None, 1, False, False, ()),
    3: PlanRules(REFINED_WIDTH, True, True, FLAT_BINS, GROUPED_NARROW_SDS, False, GROUP_SHARE, 1, False, False, ()),
    4: PlanRules(REFINED_WIDTH, True, True, FLAT_BINS, GROUPED_NARROW_SDS, True, GROUP_SHARE, 1, False, False, ()),
    5: PlanRules(REFINED_WIDTH, True, True, FLAT_BINS, GROUPED_NARROW_SDS, True, GROUP_SHARE_5, MIN_FLAT_BINS, False, False, ()),
    6: PlanRules(REFINED_WIDTH, True, True, FLAT_BINS, GROUPED_NARROW_SDS, True, GROUP_SHARE_5, MIN_FLAT_BINS, True, True, ()),
    7: PlanRules(REFINED_WIDTH, True, True, FLAT_BINS, GROUPED_NARROW_SDS, True, GROUP_SHARE_5, MIN_FLAT_BINS, True, True, ("add-remove",)),
    8: PlanRules(REFINED_WIDTH, True, True, FLAT_BINS, GROUPED_NARROW_SDS, True, GROUP_SHARE_5, MIN_FLAT_BINS, True, True,
                 ("add-remove", "substitution")),
    9: PlanRules(REFINED_WIDTH, True, True, FLAT_BINS, GROUPED_NARROW_SDS, True, GROUP_SHARE_5, MIN_FLAT_BINS, True, False, (),
                 level_one=True),
}


@dataclass(frozen=True)
class RoundTwo:
    """Round two's design: "bins" (a histogram whose bins end at `ends`, filled in "linear"ly or by
    "pchip") or "tree" (`AdaptiveMechanism.tree` on the whole grid). `groups` (plan version 3; empty:
    none) are the ends of a coarser partition, a subset of `ends`: each of its bins holding several of
    `ends`' bins (a "split group", a spike's run of fine bins) is also counted whole."""

    design: str
    ends: tuple[int, ...] = ()
    fill: str = "linear"
    groups: tuple[int, ...] = ()


class RoundOnePlanner:
    """`AdaptiveMechanism.plan` and the statistics it is made of (a mixin: no state of its own)."""

    # the mechanism's parameters the plan reads (`AdaptiveMechanism` sets them)
    size: int
    relation: str
    fine: bool
    share_rule: int
    rules: PlanRules
    round_one_ends: np.ndarray
    fine_ends: np.ndarray
    bins_one: int
    isolated_sds: float

    if TYPE_CHECKING:  # the mechanism's, too
        def noise_variance(self, round_: int, copies: int = 1, fine: bool = False, root: bool = False) -> float: ...

    def coarse_counts(self, counts: np.ndarray, copies: int = 1) -> tuple[np.ndarray, float]:
        """Round one's coarse bin counts and their noise variance: with fine bins, the inverse-variance
        mean of each coarse count and its fine bins' sum (post-processing of round one)."""
        counts = np.asarray(counts, dtype=np.float64)
        coarse, var = counts[:ROUND_ONE_BINS], self.noise_variance(1, copies)
        if not self.fine or self.rules.level_one:  # (version 9: the coarse counts are the fine ones' sums already)
            return coarse, var
        sums = counts[ROUND_ONE_BINS:].reshape(ROUND_ONE_BINS, -1)
        sums_var = self.noise_variance(1, copies, fine=True) * sums.shape[1]
        return (coarse / var + sums.sum(axis=1) / sums_var) / (1 / var + 1 / sums_var), 1 / (1 / var + 1 / sums_var)

    def round_one_estimate(self, counts: np.ndarray, n: float, copies: int = 1) -> np.ndarray:
        """Round one's prefix-count estimate: its coarse bins (`coarse_counts`) conditioned on n
        (substitution), cumulated, monotone, PCHIP in between."""
        counts = self.coarse_counts(counts, copies)[0]
        if self.relation == "substitution":
            counts = counts + (n - counts.sum()) / counts.size
        at_ends = postprocess.monotone(np.cumsum(counts), 0.0, float(n), 2, float(n) if self.relation == "substitution" else None)
        return fill_pchip(at_ends, self.round_one_ends, self.size)

    def flat_statistic(self, counts: np.ndarray, n: float, copies: int = 1) -> float:
        """The spread of round one's coarse bin counts over what sampling (n w_j / N per bin) and noise
        explain: about 1 for data spread evenly over the grid, far above for concentrated data."""
        counts = np.asarray(counts, dtype=np.float64)[:ROUND_ONE_BINS]
        widths = np.diff(np.append(-1, self.round_one_ends))
        expected = n * widths / self.size
        spread = np.sum((counts - counts.sum() * widths / self.size) ** 2)
        return float(spread / np.sum(self.noise_variance(1, copies) + expected) / (1 - 1 / counts.size))

    def missed_structure(self, counts: np.ndarray, n: float, ends: np.ndarray, copies: int = 1) -> float:
        """An unbiased estimate (clipped at 0) of what linear interpolation between `ends` misses of
        the data's shape at round one's resolution, per grid index: round one's linear estimate's
        squared departure from its interpolation at `ends`, less the exact part its noise explains.
        So a shape round one half-sees still gets bins when a flat design is chosen. `ends` are
        equal-width (`equal_width_ends`): the departure is linear between round one's ends and `ends`
        together, and its sum of squares has a closed form (`linear_energy`): O(bins^2), whatever the
        grid (nothing is missed when `ends` include round one's)."""
        known = n if self.relation == "substitution" else None  # conditioned on n
        return interpolation_miss(counts, self.round_one_ends, ends, self.noise_variance(1, copies), self.size, known)

    def plan(self, round_one: np.ndarray, n: float | None = None, copies: int = 1) -> RoundTwo:
        """Round two's design from round one's noisy bin counts (and n, public under substitution;
        None under add/remove: round one's sum). Post-processing of round one: no privacy cost."""
        counts = np.asarray(round_one, dtype=np.float64).reshape(-1)
        if counts.size != self.bins_one or not np.isfinite(counts).all():
            raise ParameterError(f"round one is {self.bins_one} finite bin counts, got {counts.size} values")
        bridge = self.relation == "substitution"
        if bridge and (n is None or isinstance(n, bool) or not np.isfinite(float(n)) or n < 0):
            raise ParameterError(f"under substitution round two is planned with n (a count), got {n!r:.40}")
        total = float(n) if bridge and n is not None else max(float(counts.sum()), 1.0)  # (bridge: n given, above)
        var = self.noise_variance(2, copies)
        if self.flat_statistic(counts, total, copies) < FLAT_LIMIT:
            flat = self.rules.flat_bins
            options = [equal_width_ends(self.size, k) for k in flat if k <= self.size // 2]
            risks = [total / (6 * e.size) + self.missed_structure(counts[:ROUND_ONE_BINS], total, e, copies)
                     + bins_noise(e, self.size, var, bridge) for e in options]
            best = int(np.argmin(risks))
            if bridge:  # `flat` ascends, and every count up to 128 fits a grid of 256
                best = max(best, flat.index(self.rules.min_flat_bins))
            return RoundTwo("bins", tuple(int(i) for i in options[best]), "linear")
        estimate = self.round_one_estimate(counts, total, copies)
        options = [mass_ends(estimate, total, k) for k in MASS_BINS if k <= self.size // 2]
        risks = [total / (6 * e.size) + float(np.mean((estimate - fill_pchip(estimate[e], e, self.size)) ** 2))
                 + bins_noise(e, self.size, var, bridge) for e in options]
        best = int(np.argmin(risks))
        refined = self.refined_ends(counts, copies) if self.fine else None
        planned = GRADED_PLANNED_BINS if self.rules.graded else MAX_PLANNED_BINS
        histogram = refined is not None or MASS_BINS[best] <= planned  # else the tree, below
        unplaced = self.unplaced(counts, refined, copies) if self.fine and self.rules.unplaced and histogram else None
        if self.rules.graded and not bridge and refined is None and unplaced is not None and MASS_BINS[best] > MAX_PLANNED_BINS:
            return RoundTwo("tree")  # narrow spikes the spike test misses, under add/remove: the tree (`GRADED_PLANNED_BINS`)
        if refined is not None or unplaced is not None:  # a spike: the histogram, cut finely where round one sees it
            base = options[min(best, MASS_BINS.index(MAX_PLANNED_BINS))]  # 32 beside a spike's cuts (`GRADED_PLANNED_BINS`)
            if unplaced is not None:  # round one's coarse ends around mass it cannot place (version 4: and the
                # mass plan's elsewhere, `busy_ends`)
                base = self.busy_ends(counts, base, unplaced, copies) if self.rules.graded else self.round_one_ends
            found = np.isin(self.fine_ends, unplaced) if unplaced is not None else None  # `unplaced_bins`' mask
            heavy = self.heavy_ends(counts, found, copies) if found is not None and self.rules.graded else None
            ends = functools.reduce(np.union1d, [e for e in (base, refined, unplaced, heavy) if e is not None])
            crowded = counts[ROUND_ONE_BINS:].max() > TREE_SDS * np.sqrt(var)  # a small bin's interpolation would cost more
            if ends.size > MAX_REFINED_BINS or crowded:
                return RoundTwo("tree")
            runs = np.zeros(self.fine_ends.size, np.bool_)  # the fine bins cut as a spike or as mass round one cannot place
            if refined is not None:
                runs |= self.spike_bins(counts, copies)
            if found is not None:  # (unplaced)
                runs |= found
            groups = self.split_groups(ends, runs) if self.rules.groups else ends
            split = tuple(int(i) for i in groups) if groups.size < ends.size else ()  # () when no run holds two bins
            return RoundTwo("bins", tuple(int(i) for i in ends), "pchip", split)
        if not histogram:
            return RoundTwo("tree")
        ends = graded_ends(options[best], GRADE) if self.rules.graded else options[best]
        return RoundTwo("bins", tuple(int(i) for i in ends), "pchip")

    def refined_ends(self, counts: np.ndarray, copies: int = 1, kept: np.ndarray | None = None) -> np.ndarray | None:
        """Bin ends cutting each fine bin that holds a spike into bins of REFINED_WIDTH points (2 in plan
        version 1, or above NARROW_SDS, GROUPED_NARROW_SDS from version 3; 8 below WIDE_SDS under share
        rule 2 and add/remove) (None if none does): a fine bin (or a pair of neighbours, for a spike on
        their edge) whose count exceeds what the coarse bins' PCHIP shape puts there by `FINE_SDS` noise
        sds and by that shape's count again. Skewed but smooth data (which the shape follows) is not cut; a spike is, wherever it lies.
        `kept`: these fine bins instead (`heavy_ends`)."""
        kept = self.spike_bins(counts, copies) if kept is None else kept
        if not kept.any():
            return None
        fine = np.asarray(counts, dtype=np.float64)[ROUND_ONE_BINS:]
        starts = np.append(0, self.fine_ends[:-1] + 1)
        heaviest = fine[kept].max() / np.sqrt(self.noise_variance(2, copies))  # in round-two noise sds
        w = 2 if heaviest > self.rules.narrow_sds else self.rules.refined_width  # 2-point bins where a spike is heavy (interpolation)
        if self.share_rule >= 2 and self.fine and self.relation == "add-remove" and heaviest < WIDE_SDS:
            w = 2 * self.rules.refined_width  # ... and 8-point bins where it is light (fewer noises in its sum)
        cuts = [np.arange(a + w - 1, b, w) for a, b in zip(starts[kept], self.fine_ends[kept])]
        ends = np.unique(np.concatenate(cuts + [starts[kept] - 1, self.fine_ends[kept], np.array([self.size - 1])]))
        return ends[ends >= 0]

    def heavy_ends(self, counts: np.ndarray, found: np.ndarray, copies: int = 1) -> np.ndarray | None:
        """Plan version 4: `refined_ends` for the fine bins of mass round one cannot place (`found`, the
        mask `unplaced_bins` gives) that hold `FINE_SDS` noise sds. On a grid of 2^10 a coarse bin holds two fine ones, so a spike
        filling one is at most about twice what the coarse shape puts there and the spike test often
        misses it; its mass was spread over a 16-point bin (five spikes of 600 values, sd 2, 40 paired runs, counts MSE at eps 0.5
        and 1: 0.29x and 0.09x under add/remove, 0.24x and 0.15x under substitution)."""
        fine = np.asarray(counts, dtype=np.float64)[ROUND_ONE_BINS:]
        heavy = found & (fine > FINE_SDS * np.sqrt(self.noise_variance(1, copies, fine=True)))
        return self.refined_ends(counts, copies, heavy)

    def spike_bins(self, counts: np.ndarray, copies: int = 1) -> np.ndarray:
        """Which fine bins hold a spike (`refined_ends`), a mask over them."""
        counts = np.asarray(counts, dtype=np.float64)
        coarse, fine = counts[:ROUND_ONE_BINS], counts[ROUND_ONE_BINS:]
        shape = fill_pchip(np.maximum.accumulate(np.cumsum(np.maximum(coarse, 0.0))), self.round_one_ends, self.size)
        expected = np.diff(np.append(0.0, shape[self.fine_ends]))  # the fine counts the coarse shape explains
        sd = np.sqrt(self.noise_variance(1, copies, fine=True))
        expected = np.maximum(expected, 0.0)
        kept = fine - expected > np.maximum(FINE_SDS * sd, expected)
        pair, pair_expected = fine[1:] + fine[:-1], expected[1:] + expected[:-1]  # a spike on a fine bin's edge
        pairs = pair - pair_expected > np.maximum(FINE_SDS * np.sqrt(2) * sd, pair_expected)
        return kept | np.append(pairs, False) | np.append(False, pairs)

    def unplaced(self, counts: np.ndarray, refined: np.ndarray | None, copies: int = 1) -> np.ndarray | None:
        """Bin ends cutting, at the fine bins' ends, each coarse bin (or pair) that holds `ISOLATED_SDS`
        noise sds (times the coarse share's shrink under share rule 2: rule 1's count) between bins within 2 sds of zero and in which no fine bin was cut (`refined`) (None
        if there is none): mass round one cannot place, spikes its fine bins did not see (their noise
        at small epsilon), which a plan from the coarse shape would spread over the whole bin and past it.
        The plan then takes round one's coarse ends around them, not ends at equal mass of that shape.
        A run at the grid's end is not isolated there: nothing outside the grid is known to be empty
        (skewed data's first bins, the steep side of a smooth shape, are not cut)."""
        found = self.unplaced_bins(counts, refined, copies)
        return self.fine_ends[found] if found.any() else None

    def unplaced_bins(self, counts: np.ndarray, refined: np.ndarray | None, copies: int = 1) -> np.ndarray:
        """Which fine bins lie in a coarse bin holding mass round one cannot place (`unplaced`), a mask."""
        coarse, var = self.coarse_counts(counts, copies)
        sd = np.sqrt(var)
        padded = np.concatenate([[np.inf], coarse, [np.inf]])  # the grid's ends: not known empty
        empty = padded < 2 * sd
        starts = np.append(0, self.round_one_ends[:-1] + 1)
        cut = np.zeros(coarse.size, bool) if refined is None else np.array(
            [np.any((refined >= a) & (refined < b)) for a, b in zip(starts, self.round_one_ends)])
        found = np.zeros(coarse.size, bool)
        for width in (1, 2):  # a run of 1 or 2 heavy bins at j .. j + width - 1
            for j in range(coarse.size - width + 1):
                if padded[j + 1:j + 1 + width].sum() > self.isolated_sds * sd * np.sqrt(width) and empty[j] \
                        and empty[j + 1 + width] and not cut[j:j + width].any():
                    found[j:j + width] = True
        return found[np.searchsorted(self.round_one_ends, self.fine_ends)]  # each fine bin's coarse bin's

    def busy_ends(self, counts: np.ndarray, mass: np.ndarray, unplaced: np.ndarray, copies: int = 1) -> np.ndarray:
        """Plan version 4, where round one finds mass it cannot place (`unplaced`): round one's coarse ends,
        and the mass plan's ends `mass` inside every other coarse bin that holds mass (not within 2 sds of
        zero). Version 3 kept the coarse ends alone, which spread the spikes the 8-sd test for unplaced
        mass missed (five spikes of 1,000 values at eps 0.1 under substitution, 100 paired runs: counts
        MSE 0.47x; at n = 10^3 and eps 0.5, 0.43x; every other cell measured 0.93 to 1.02x)."""
        coarse, var = self.coarse_counts(counts, copies)
        busy = (coarse >= 2 * np.sqrt(var)) & ~np.isin(self.round_one_ends, unplaced)  # a cut coarse bin's end is a fine end
        return np.union1d(self.round_one_ends, mass[busy[np.searchsorted(self.round_one_ends, mass)]])

    def split_groups(self, ends: np.ndarray, runs: np.ndarray) -> np.ndarray:
        """Plan version 3: `ends` less those inside a run of the fine bins `runs` marks (cut as a spike,
        `spike_bins`, or as mass round one cannot place, `unplaced_bins`): each run becomes one group of
        round two's bins, whose total is counted too (`GROUP_SHARE`, `GROUP_SHARE_5`, of the budget; module docstring of
        `adaptive`). A run's mass then enters every prefix past it with one group's noise, not with
        the sum of its bins' noises."""
        fine_bin = np.searchsorted(self.fine_ends, ends)  # the fine bin holding each end, and the next index
        after = np.searchsorted(self.fine_ends, np.minimum(ends + 1, self.size - 1))
        inside = (ends < self.size - 1) & runs[fine_bin] & runs[after]
        return ends[~inside]
