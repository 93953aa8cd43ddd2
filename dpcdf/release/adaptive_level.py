"""Plan version 9: round one is one level of the whole tree, so a release that ends in the tree loses nothing.

Versions 1 to 8 spend round one's 20% of epsilon on bins of their own (32 coarse, then fine ones). Where
the rounds end in the tree, those counts can only be merged into a tree at 80% of epsilon (`merge`):
its exact variance stays 1.23 to 1.27x the whole tree's on 2^10 whatever round two's level budgets
(docs/accuracy.md, "What is left"), and the route and screen of versions 6 to 8 (`adaptive_route`)
save that only where round zero's 2% can tell in advance.

Version 9 asks round one for the counts of one level of the whole tree (`TreeMechanism` at all of
epsilon), at that level's own budget and with that level's node noise (the same node ids and scale
as the tree's: a server answers them from the same PRF noise, so asking them again gives the same
values). Its fine bins are those nodes (`layout`: the level whose node count is nearest
`adaptive.fine_bins`, at least 64); its 32 coarse bins are sums of consecutive ones (post-processing).
The plan is made from them as before (`RoundOnePlanner`). Then:

- the tree: the release asks the other levels and reuses round one's as that level's answer. It is
  the tree mechanism's release itself, value for value, at the tree's guarantee;
- a histogram: round two spends epsilon less the level's budget, as a histogram did before.

Privacy: the guarantee is the larger of the two outcomes' (adaptive composition of pure DP: the
choice is post-processing of round one): the tree's own (round one is one of its levels), or the
level's Delta / scale plus round two's histogram, at most epsilon (`AdaptiveMechanism.exact_epsilon`).
"""
from __future__ import annotations

import numpy as np

from .adaptive_plan import ROUND_ONE_BINS
from .mechanisms import TreeMechanism

MIN_LEVEL_NODES = 2 * ROUND_ONE_BINS  # round one's level has at least this many nodes (two fine bins per coarse one)


def one_level(tree: TreeMechanism, target: int) -> int:
    """The tree level round one counts: of the levels below the root with at least MIN_LEVEL_NODES
    data-holding nodes (the leaves always qualify on an adaptive grid), the one whose node count is
    nearest `target` in ratio. A function of public parameters."""
    counts = [-(-tree.size // tree.shape.branching**level) for level in range(tree.shape.height)]
    usable = [level for level, c in enumerate(counts) if c >= MIN_LEVEL_NODES] or [0]
    return min(usable, key=lambda level: (abs(np.log(counts[level] / target)), level))


def layout(tree: TreeMechanism, target: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(level, fine ends, coarse ends): round one's level (`one_level`), its nodes' last grid indices
    (the fine bins), and ROUND_ONE_BINS coarse bins, each of consecutive fine bins as even in number as
    the level allows."""
    level = one_level(tree, target)
    fine = tree.node_bounds(level)[1]
    groups = -(-np.arange(1, ROUND_ONE_BINS + 1) * fine.size // ROUND_ONE_BINS) - 1  # last fine bin of each coarse one
    return level, fine, fine[groups]


def with_coarse(fine_counts: np.ndarray, fine_ends: np.ndarray, coarse_ends: np.ndarray) -> np.ndarray:
    """Round one's counts as the planner reads them: the coarse bins' (sums of their fine bins), then the fine bins'."""
    fine_counts = np.asarray(fine_counts, np.float64).reshape(-1)
    last = np.searchsorted(fine_ends, coarse_ends)
    sums = np.cumsum(fine_counts)[last]
    return np.concatenate([np.diff(np.append(0.0, sums)), fine_counts])
