"""Tree geometry for tree-structured noise: node ids, leaf-to-root paths, coverings of prefixes,
and the exact sensitivity of the path mechanism.

A tree of branching factor b and height h has levels 0 (the b^h leaves) to h (the root); node
(l, j) covers leaves [j b^l, (j + 1) b^l). Only the first `size` leaves are data; the rest pad the
tree and are never released.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..errors import ParameterError

LEVEL_SHIFT = 56  # node id = level << 56 | index


@dataclass(frozen=True)
class TreeShape:
    branching: int
    height: int
    size: int  # data leaves

    @classmethod
    def for_size(cls, size: int, branching: int) -> "TreeShape":
        if branching < 2:
            raise ParameterError(f"branching must be >= 2, got {branching}")
        height = max(1, math.ceil(math.log(size, branching) - 1e-12))
        while branching**height < size:
            height += 1
        return cls(branching, height, size)

    def node_id(self, level: np.ndarray, index: np.ndarray) -> np.ndarray:
        return (np.asarray(level, np.uint64) << np.uint64(LEVEL_SHIFT)) | np.asarray(index, np.uint64)

    def path(self, leaves: np.ndarray) -> np.ndarray:
        """(len(leaves), height + 1) node ids of each leaf's ancestors, leaf (level 0) to root."""
        leaves = np.asarray(leaves, np.int64)
        levels = np.arange(self.height + 1)
        index = leaves[:, None] // (self.branching ** levels)[None, :]
        return self.node_id(np.broadcast_to(levels, index.shape), index)

    def covering(self, leaf: int) -> list[tuple[int, int]]:
        """The nodes (level, index) whose disjoint ranges make up the prefix [0, leaf]: for each
        level, the base-b digit of leaf + 1 counts that level's nodes (Lemma IV.1 of the optimal-tree
        paper). The whole padded domain is the root alone."""
        count = leaf + 1
        if count == self.branching**self.height:
            return [(self.height, 0)]
        nodes, start = [], 0
        for level in range(self.height - 1, -1, -1):
            width = self.branching**level
            digit = (count - start) // width
            nodes += [(level, start // width + k) for k in range(digit)]
            start += digit * width
        return nodes

    def covering_counts(self) -> np.ndarray:
        """n_l: how often a level-l node appears in the coverings of all `size` prefixes."""
        counts = np.zeros(self.height + 1, np.int64)
        full = self.branching**self.height
        c = np.arange(1, self.size + 1, dtype=np.int64)
        if self.size == full:
            counts[self.height] += 1
            c = c[:-1]
        for level in range(self.height):
            counts[level] = int(((c // self.branching**level) % self.branching).sum())
        return counts


# --- exact sensitivity of the path mechanism ------------------------------------------------------
_K = 4  # ancestor offsets explored: -K..K (optimal solutions need far less)


@njit(cache=True)
def _min_shifts(target, size, height):
    """Fewest signed unit node shifts (nodes of every level of a binary tree with 2^height leaves)
    whose ranges' indicators sum to `target` on leaves [0, size); leaves beyond are free.
    Dynamic program over (node, offset inherited from the ancestors)."""
    big = 1 << 30
    width = 2 * _K + 1
    nleaf = 1 << height
    cost = np.zeros((nleaf, width), np.int64)
    for i in range(nleaf):
        for k in range(width):
            cost[i, k] = abs(target[i] - (k - _K)) if i < size else 0
    while cost.shape[0] > 1:
        up = np.full((cost.shape[0] // 2, width), big, np.int64)
        for v in range(up.shape[0]):
            for k in range(width):
                for z in range(-_K, _K + 1):
                    kk = k + z
                    if 0 <= kk < width:
                        c = abs(z) + cost[2 * v, kk] + cost[2 * v + 1, kk]
                        if c < up[v, k]:
                            up[v, k] = c
        cost = up
    best = big
    for z in range(-_K, _K + 1):  # the root's own shift, from offset 0
        c = abs(z) + cost[0, _K + z]
        best = min(best, c)
    return best


@njit(cache=True)
def _worst_case(size, height, suffixes_only):
    target = np.zeros(1 << height, np.int64)
    worst = 0
    for a in range(size):
        for b in range(a, size):
            if suffixes_only and b != size - 1:
                continue
            target[:] = 0
            target[a : b + 1] = 1
            worst = max(worst, _min_shifts(target, size, height))
    return worst


def path_sensitivity_bruteforce(size: int, relation: str) -> int:
    """The path mechanism's exact sensitivity by brute force over every neighbouring change (all
    intervals of prefix counts for substitution, all suffixes for add/remove). Small sizes only."""
    height = max(1, math.ceil(math.log2(size)))
    if height > 8:
        raise ParameterError("the brute force is for trees of at most 2^8 leaves")
    return int(_worst_case(size, height, relation == "add-remove"))


def path_sensitivity(height: int, relation: str) -> int:
    """Exact sensitivity of the path mechanism on a full binary tree of 2^height leaves: L = height
    signed node shifts explain the worst substitution, ceil((L + 1) / 2) the worst addition or
    removal (checked against the brute force up to L = 7). For fewer data leaves it is an upper
    bound, so the calibration stays safe."""
    return height if relation == "substitution" else (height + 2) // 2
