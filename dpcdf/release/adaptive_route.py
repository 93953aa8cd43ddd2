"""Plan version 6's route: the whole tree on large data, the two rounds on small (`AdaptiveMechanism`).

A histogram's interpolation error grows with the square of the counts; the tree's noise does not grow
with n. So past some n no histogram round one could find would be chosen (`plan_error`), and round
one's budget would only be lost: the release then takes the whole tree, with every bit of epsilon.
Which side of that n the data lies on is known before round one:

- under substitution n is public: the route is a function of it (post-processing of nothing private;
  version 8 adds the screen, below);
- under add/remove n is not public: round zero counts the whole grid with `ZERO_SHARE` of epsilon
  (DLap(1 / eps_0)), and the route is a function of that count (post-processing of round zero).

The rest of epsilon, eps_r = epsilon - eps_0, goes to one route: the whole tree (`TreeMechanism` at
eps_r) or the two rounds (round one's bins, then a histogram or the round-two tree, at eps_r
together). A server answers one route per task (the release design fixed at the first query that
takes one: `dpcdf.service.server.answers`), so the guarantee is eps_0 + max(whole tree, rounds) <=
epsilon whichever route the analyst takes (adaptive composition of pure DP). Round zero's count,
answered from the server's PRF noise, is the same at every ask. Every count the release has paid for
enters its estimate: round zero's and round one's by least squares into the tree that ends it
(`merge`).

Plan version 7 (`PlanRules.screen`), add/remove: round zero counts round one's fine bins instead of
the grid (the same share: the fine bins partition the grid, so their counts move by 1 in L1), n is
their sum, and the release also takes the whole tree where those counts show point masses that no
histogram round one could propose would be kept by (`screened`): a fine bin's mass costs a histogram
at least POINT_MASS c^2 over the `MIN_REACH` grid indices of its narrowest bin, the same term
`plan_error.hidden_miss` adds when the rounds choose. Real data (integers, rounded values, one
popular value) mostly are such; there the rounds would end in the tree, at 1.3 to 2x its error on
the DPBench sets at 10^4 records, and the screen keeps the whole tree's (bench/accuracy_sweep.py).

Plan version 8: the same under substitution. There n is public, so version 7 had no round zero (n is
the route's n, exactly); version 8 counts the fine bins with ZERO_SHARE of epsilon at DLap(2 / eps_0)
(a unit that changes bins moves two counts by 1: `zero_sensitivity`) for the screen alone, and the
route's n stays the public n. It costs every release 2% of epsilon (1.02 to 1.04x the tree's error
where n alone took the whole tree); it saves the rounds (1.2 to 1.6x the tree's error) where point
masses are screened (bench/accuracy_sweep.py, docs/accuracy.md).

The route's n: `whole_limit`, the n at which a histogram's least hidden error (round one's fine bins
each holding n / k as a point mass, `plan_error.hidden_miss`), times `plan_error.SAFETY`, reaches the
whole tree's exact error: sqrt(SAFETY^-1 error / POINT_MASS) k. Above it the rounds would end in the
tree (at about 1.25x its error, `merge`); below it they may find a histogram.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from . import plan_error
from .adaptive_plan import PLAN_RULES, PlanRules
from .noise import dlaplace_variance, scale_fraction

ZERO_SHARE = 0.02  # add/remove from plan version 6, substitution from 8: round zero's share of epsilon (`zero_ends`' counts)
MIN_REACH = 2  # the fewest grid indices a proposed histogram's bin around a point mass spans (`refined_ends`: 2-point bins)
N_SDS = 1.0  # round zero's n (version 7: a sum of many counts) taken this many of its sds low (3 sent DPBench sets of
# 10^4 records at eps 1 to the rounds in about half the tasks, 1.2x the tree's error)
SCREEN_SDS = 3.0  # round zero's estimate of the point masses' squares taken this many of its sds low (towards the rounds:
# at 1 sd, spread data at n = 150 on 2^8, eps 4, took the whole tree on round zero's noise in about 1 task of 6)
ROUND_ZERO_IDS = 1 << 42  # round zero's noise ids (round one's bins from 2^40, round two's from 2^41; tree nodes below 2^40 or from 2^56)


def takes_routes(plan_version: int, fine: bool) -> bool:
    """Whether a release of this plan version (and round one with or without fine bins) has the route:
    the one rule the mechanism (`RoutedRelease.routed`) and the servers' route fix both read."""
    return PLAN_RULES[plan_version].route and fine


class RoutedRelease:
    """The route of plan version 6 (module docstring), mixed into `AdaptiveMechanism`: no state of its own
    beyond what `route_budget` sets."""

    eps_zero: float  # set by `route_budget`
    scale_zero: Fraction | None
    # the mechanism's parameters the route reads (`AdaptiveMechanism` sets them)
    size: int
    epsilon: float
    relation: str
    fine: bool
    plan_version: int
    rules: PlanRules
    fine_ends: np.ndarray
    round_one_parts: list[np.ndarray]
    scale_one: Fraction
    scale_fine: Fraction | None

    @property
    def routed(self) -> bool:
        return takes_routes(self.plan_version, self.fine)

    def route_budget(self) -> float:
        """Sets round zero's budget and scale (routed: add/remove, or `screens`; else none) and returns the rest, the
        budget of either route, as a float whose exact sum with round zero's is at most epsilon."""
        self.eps_zero, self.scale_zero = 0.0, None
        if not self.routed or (self.relation != "add-remove" and not self.screens):
            return self.epsilon
        self.eps_zero = self.epsilon * ZERO_SHARE
        rest = self.epsilon - self.eps_zero
        while Fraction(self.eps_zero) + Fraction(rest) > Fraction(self.epsilon):
            rest = math.nextafter(rest, 0.0)
        self.scale_zero = scale_fraction(self.zero_sensitivity, self.eps_zero)
        return rest

    @property
    def screens(self) -> bool:
        """Whether round zero counts the fine bins, for the screen (`screened`): plan version 7 under
        add/remove, version 8 under both relations (`PlanRules.screen`)."""
        return self.relation in self.rules.screen

    @property
    def zero_sensitivity(self) -> int:
        """Round zero's L1 sensitivity: 1 under add/remove; under substitution 2 for the fine bins' counts
        (a unit leaves one and joins another), none needed for v6's exact n."""
        return 2 if self.relation == "substitution" else 1

    @property
    def zero_ends(self) -> np.ndarray:
        """Round zero's partition: the whole grid, or (`screens`: plan version 7 under add/remove, 8 under
        both) round one's fine bins."""
        return self.fine_ends if self.screens else np.array([self.size - 1], np.int64)

    def zero_n(self, zero: np.ndarray, copies: int = 1) -> float:
        """The n round zero's counts give the route (`take_whole`): their sum; from plan version 7 (many
        counts, whose sum is noisier than one count of the grid) `N_SDS` of its sds low, so that
        small data do not take the whole tree on noise (the rounds can find a histogram there)."""
        zero = np.asarray(zero, np.float64)
        low = 0.0
        if self.screens and self.scale_zero is not None:  # (a screen has round zero's scale: `route_budget`)
            low = N_SDS * math.sqrt(zero.size * copies * dlaplace_variance(self.scale_zero))
        return float(zero.sum()) - low

    def screened(self, zero: np.ndarray, copies: int = 1) -> bool:
        """Plan version 7 (add/remove), 8 (both relations): whether round zero's fine counts show point masses whose least cost to any
        histogram the rounds could keep, times `plan_error.SAFETY`, is above the tree's error (module
        docstring): sum c^2 estimated without bias (each count squared less its noise variance), taken
        `SCREEN_SDS` of its sds low (Var of a noisy square: 4 c^2 var + E z^4 - var^2, z the sum of `copies`
        Laplace noises; the discrete Laplace's fourth moment is within a few percent of it at the scales
        round zero has), so that where round zero's noise hides the masses the rounds still choose, and
        spread data do not take the whole tree on noise. Post-processing of round zero."""
        if not self.screens or self.scale_zero is None:
            return False
        one = dlaplace_variance(self.scale_zero)  # a server's noise; `copies` of them add up
        var = copies * one
        fourth = copies * 6 * one**2 + 3 * copies * (copies - 1) * one**2  # E z^4 of the sum (Laplace: E z^4 = 6 var^2)
        zero = np.asarray(zero, np.float64)
        squares = float(np.sum(zero**2 - var))
        sd = math.sqrt(float(np.sum(4 * np.maximum(zero**2 - var, 0.0) * var + fourth - var**2)))
        least = plan_error.POINT_MASS * MIN_REACH * max(0.0, squares - SCREEN_SDS * sd) / self.size
        return plan_error.SAFETY * least > plan_error.tree_error(self, copies)

    def zero_epsilon(self, relation: str | None = None) -> Fraction:
        """Round zero's epsilon under `relation` (default the mechanism's own): its counts' L1 sensitivity
        there over its scale. Under substitution the fine bins' counts move by 2 and the grid's count
        (version 6) not at all; under add/remove either moves by 1 (review of version 8: the stated
        epsilon under the other relation counted the fine bins at 1)."""
        if self.scale_zero is None:
            return Fraction(0)
        if (relation or self.relation) == "add-remove":
            return 1 / self.scale_zero
        return Fraction(2 if self.zero_ends.size > 1 else 0) / self.scale_zero

    def whole_limit(self, copies: int = 1) -> float:
        """The n above which the release takes the whole tree (module docstring)."""
        k = self.fine_ends.size
        return k * math.sqrt(plan_error.tree_error(self, copies, whole=True) / (plan_error.POINT_MASS * plan_error.SAFETY))

    def take_whole(self, n: float, copies: int = 1) -> bool:
        """Whether data of n values (under add/remove round zero's noisy count) takes the whole tree."""
        return float(n) > self.whole_limit(copies)

    def reuse_parts(self, design: str) -> tuple[list[np.ndarray], list[Fraction]]:
        """(partitions' ends, their noise scales) that the tree ending a routed release of `design`
        ("tree" or "whole") has not counted itself: round zero's counts (add/remove), and
        for the round-two tree round one's bins; ([], []) for anything else."""
        if not self.routed or design not in ("tree", "whole"):
            return [], []
        fine = [self.scale_fine] if self.scale_fine is not None else []  # as `round_one_parts`: with the fine bins
        parts, scales = (list(self.round_one_parts), [self.scale_one, *fine]) if design == "tree" else ([], [])
        if self.scale_zero is not None:
            parts, scales = parts + [self.zero_ends], scales + [self.scale_zero]
        return parts, scales

    def reused(self, release) -> np.ndarray | None:
        """The noisy counts of `reuse_parts(release.plan.design)`, in order (None when there are none)."""
        parts = self.reuse_parts(release.plan.design)[0]
        if not parts:
            return None
        one = [np.asarray(release.round_one, np.float64)] if release.plan.design == "tree" else []
        zero = [np.atleast_1d(np.asarray(release.zero, np.float64))] if self.scale_zero is not None else []
        return np.concatenate(one + zero)

    def route_tree(self, release):
        """The tree that ends `release`: the whole tree, or round two's."""
        return self.whole if release.plan.design == "whole" else self.tree
