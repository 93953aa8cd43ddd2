"""Round one's counts reused in a tree release: the best linear unbiased estimate from both.

An adaptive release that ends in the tree (`adaptive.AdaptiveMechanism`, plan version 6) has paid for
round one's bin counts y1 = B x + e1 (B: each bin a range of grid points, e1 independent noise of
variance D) besides the tree's node counts. The tree's consistent estimate x_T of the leaf counts is
their least-squares estimate from the nodes alone (`TreeMechanism.consistent`), with covariance
S = (A' W A)^-1 (conditioned on n where the root is exact). Adding round one's rows gives the
least-squares estimate from both (the Kalman / Gauss-Markov update):

    x = x_T + S B' (B S B' + D)^-1 (y1 - B x_T),

whose covariance is S - S B' (B S B' + D)^-1 B S, never more than S. S B' is found without forming S:
the consistent estimate is the linear map (A' W A)^-1 A' W, and node counts that are zero but at the
leaves, where they are B' times the leaves' variance, have A' W y = B'; so `consistent` of those
"counts" is S B' (one batch of columns, once per mechanism: it depends on public parameters only).

All of it is post-processing of the two rounds' noisy counts: no privacy cost.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .mechanisms import TreeMechanism

_COLUMNS = 64  # columns of S B' per call of `consistent` (memory: size x _COLUMNS per level)


def bin_sums(prefix: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """B x from prefix sums (size, ...) of x: each bin's sum, bins ending at `ends` (all partitions' in a row)."""
    at = prefix[np.asarray(ends, np.int64)]
    before = np.concatenate([np.zeros((1,) + at.shape[1:]), at[:-1]])
    return at - np.where((np.diff(np.append(-1, ends)) > 0).reshape((-1,) + (1,) * (at.ndim - 1)), before, 0.0)


def response(tree: TreeMechanism, leaves, copies: int = 1, columns: int | None = None) -> np.ndarray:
    """S v for each column v of `leaves` (size, k), as prefix sums (size, k): the consistent estimate
    of node counts that are zero but at the leaves, there v times the leaves' variance. `leaves` may
    be a function of a column range (start, stop) giving those columns (with `columns` their number),
    so that they are never all in memory at once."""
    var_leaf = tree.variances()[0] * copies
    k = leaves.shape[1] if columns is None else columns
    out = np.empty((tree.size, k))
    for start in range(0, k, _COLUMNS):
        block = leaves(start, min(k, start + _COLUMNS)) if callable(leaves) else leaves[:, start:start + _COLUMNS]
        nodes = [block * var_leaf] + [np.zeros((tree.level_nodes(lv), block.shape[1]))
                                      for lv in range(1, tree.shape.height + 1)]
        out[:, start:start + _COLUMNS] = tree.consistent(nodes, copies)
    return out


@dataclass
class RoundOneMerge:
    """The update above for one tree and one set of round-one partitions (`ends`, one array per
    partition) with noise `variances` (one per partition, per noise copy)."""

    tree: TreeMechanism
    parts: tuple[np.ndarray, ...]
    variances: tuple[float, ...]
    copies: int = 1

    def __post_init__(self) -> None:
        size = self.tree.size
        self.ends = np.concatenate([np.asarray(e, np.int64) for e in self.parts])  # B, as its bins' ends
        starts = np.concatenate([np.append(0, np.asarray(e, np.int64)[:-1] + 1) for e in self.parts])
        noise = np.concatenate([np.full(len(e), v * self.copies) for e, v in zip(self.parts, self.variances)])  # D

        def rows(a: int, b: int) -> np.ndarray:  # B' columns a..b-1, (size, b - a)
            x = np.arange(size)[:, None]
            return ((x >= starts[None, a:b]) & (x <= self.ends[None, a:b])).astype(np.float64)
        self.gain_prefix = response(self.tree, rows, self.copies, self.ends.size)  # S B' as prefix sums, (size, bins)
        self.inner = bin_sums(self.gain_prefix, self.ends) + np.diag(noise)  # B S B' + D
        self.inner_inv = np.linalg.inv(self.inner)

    def apply(self, fitted: np.ndarray, round_one: np.ndarray) -> np.ndarray:
        """The merged prefix counts from the tree's consistent prefix counts `fitted` and round one's
        bin counts (both may carry a batch axis: (size, B) and (bins, B))."""
        fitted = np.asarray(fitted, np.float64)
        residual = np.asarray(round_one, np.float64) - bin_sums(fitted, self.ends)
        return fitted + self.gain_prefix @ (self.inner_inv @ residual)

    def variance_drop(self, at: np.ndarray) -> np.ndarray:
        """How much the update lowers the variance of the prefix counts at indices `at`."""
        g = self.gain_prefix[np.asarray(at, np.int64)]
        return np.einsum("ij,jk,ik->i", g, self.inner_inv, g)


def tree_prefix_variance(tree: TreeMechanism, at: np.ndarray, copies: int = 1) -> np.ndarray:
    """The exact variance of the consistent estimate's prefix counts at indices `at`: c' S c for
    c the indicator of [0, t], by `response`."""
    at = np.asarray(at, np.int64)
    columns = (np.arange(tree.size)[:, None] <= at[None, :]).astype(np.float64)
    return response(tree, columns, copies)[at, np.arange(at.size)]
