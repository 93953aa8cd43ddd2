"""The level-uniform b-ary tree mechanism (the optimal-tree paper), with its consistent estimate."""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ...errors import ParameterError
from ..noise import check_epsilon, dlaplace_variance, scale_fraction
from ..tree import TreeShape
from .accounting import ROOT_SHARE, check_relation, tree_plan
from .base import Answers, BinAnswers, CoordinateAnswers, Mechanism, NodeAnswers, NoiseFn

@dataclass
class TreeMechanism(Mechanism):
    """A level-uniform b-ary tree (the optimal-tree paper, Def. IV.1): every node below the root
    gets a noisy count, DLap(Delta / eps_l) at level l with sum_l eps_l = epsilon; a prefix is the sum
    of its covering nodes (Lemma IV.1), and `consistent` post-processes all node counts at once.

    Privacy: epsilon-DP under `relation`: one person moves one unit between two nodes of a level
    (Delta = 2, substitution) or adds/removes one unit at one node of every level (Delta = 1,
    add/remove, where the root, i.e. n, is noised as well since it is not public). Levels compose:
    the exact guarantee is the sum over noised levels of Delta / scale_l, each level budget rounded
    down by less than 2^-20 to make its scale rational, so it is at most epsilon (`statement` says
    by how much). A tree calibrated for substitution gives no add/remove guarantee. Default branching factor and level budgets minimise the exact expected squared error of the
    covering estimator for this grid size (budgets proportional to n_l^(1/3), Theorem IV.2).
    """

    size: int
    epsilon: float
    relation: str = "substitution"
    branching: int | None = None
    budgets: tuple[float, ...] | None = None
    root_share: float = ROOT_SHARE  # add/remove: the root's share of epsilon (0: the plan before it)
    shape: TreeShape = field(init=False)
    scales: list[Fraction | None] = field(init=False)

    name = "tree"

    def __post_init__(self) -> None:
        self.epsilon = check_epsilon(self.epsilon)
        check_relation(self.relation)
        if self.branching is None or self.budgets is None:  # planned once per (size, epsilon, relation, b)
            self.branching, budgets = tree_plan(self.size, self.epsilon, self.relation, self.branching, self.root_share)
            self.budgets = budgets if self.budgets is None else self.budgets
        self.shape = TreeShape.for_size(self.size, self.branching)
        noised = self.noised_levels()
        if len(self.budgets) != len(noised) or min(self.budgets) <= 0:
            raise ParameterError(f"need {len(noised)} positive level budgets, got {self.budgets}")
        delta = self.level_sensitivity(self.relation)
        self.scales = [None] * (self.shape.height + 1)
        for level, eps_l in zip(noised, self.budgets):
            self.scales[level] = scale_fraction(delta, eps_l)
        # exactly, with the budgets as the sampler uses them (each rounded down to a rational): the noised levels'
        if sum((delta / s for s in self.scales if s is not None), Fraction(0)) > Fraction(self.epsilon):
            raise ParameterError(f"level budgets {self.budgets} exceed epsilon {self.epsilon}")

    def noised_levels(self) -> list[int]:
        """Levels with noisy counts: all below the root; the root (n) too under add/remove, where n is
        not public and every normalised value, and every prefix past the data, rests on its estimate."""
        return list(range(self.shape.height)) + ([self.shape.height] if self._root_noised() else [])

    def _root_noised(self) -> bool:
        if self.relation != "add-remove":
            return False
        return self.root_share != 0 or self.size == self.shape.branching**self.shape.height

    def released_levels(self) -> list[int]:
        """Levels whose counts are released: the noised ones, plus the root when it is public (n)."""
        return self.noised_levels() + ([self.shape.height] if self.relation == "substitution" else [])

    @staticmethod
    def level_sensitivity(relation: str) -> int:
        return 2 if check_relation(relation) == "substitution" else 1

    def exact_epsilon(self, relation: str) -> Fraction | None:
        """The sum over noised levels of Delta / scale_l (Delta = 2 under substitution, 1 under
        add/remove), exactly. Add/remove needs a noised root, so a tree calibrated for substitution
        gives no add/remove guarantee (None; `epsilon_for` says inf)."""
        if check_relation(relation) == "add-remove" and self.relation == "substitution":
            return None
        delta = self.level_sensitivity(relation)
        return sum((delta / s for s in self.scales if s is not None), Fraction(0))

    def rounded_budgets(self) -> int:
        return len(self.noised_levels())

    def _no_guarantee(self) -> str:
        return "the tree is calibrated for substitution: its root, n, is released exactly"

    def variances(self) -> np.ndarray:
        """Noise variance per level (0 for the exact root)."""
        return np.array([0.0 if s is None else dlaplace_variance(s) for s in self.scales])

    def node_noise(self, level: int, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """The noise of nodes (level, index); zero at an exact (public) root."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        scale = self.scales[level]
        if scale is None:
            return np.zeros(idx.size, np.int64)
        return noise(self.shape.node_id(np.full(idx.size, level), idx), scale)

    def prefix_noise(self, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """The noise on the covering estimate of each prefix: the sum of its covering nodes' noise
        (`TreeShape.covering`; the whole padded domain is the root alone). Vectorized: per level, one
        call of `noise` for the distinct nodes all the coverings use, then range sums (a covering
        takes a contiguous run of each level's nodes). `noise` must give a node the same value on
        every call (a PRF), as for the servers; the central release uses `noisy` instead."""
        idx = self._indices(indices)
        b, h = self.shape.branching, self.shape.height
        out = np.zeros(idx.size, np.int64)
        count = idx + 1
        whole = count == b**h
        if whole.any():
            out[whole] = self.node_noise(h, np.zeros(1, np.int64), noise)[0]
        c = count[~whole]
        start, acc = np.zeros_like(c), np.zeros(c.size, np.int64)
        for level in range(h - 1, -1, -1):
            width = b**level
            digit = (c - start) // width
            first = start // width
            acc += self._run_noise(level, first, first + digit, noise)
            start = start + digit * width
        out[~whole] = acc
        return out

    def _run_noise(self, level: int, lo: np.ndarray, hi: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """Sum of the noise of the level's nodes [lo_k, hi_k) for each k."""
        runs = hi > lo
        if not runs.any():
            return np.zeros(lo.size, np.int64)
        lengths = (hi - lo)[runs]
        total, nodes_here = int(lengths.sum()), self.level_nodes(level)
        if total <= nodes_here:  # list the runs' nodes
            offsets = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            nodes = np.unique(np.repeat(lo[runs], lengths) + offsets)
        else:  # mark the union of the runs
            marks = np.bincount(lo[runs], minlength=nodes_here + 1) - np.bincount(hi[runs], minlength=nodes_here + 1)
            nodes = np.flatnonzero(np.cumsum(marks)[:nodes_here] > 0)
        sums = np.concatenate([[0], np.cumsum(self.node_noise(level, nodes, noise))]).astype(np.int64)
        return sums[np.searchsorted(nodes, hi)] - sums[np.searchsorted(nodes, lo)]

    def gather(self, prefix_at: Answers | None, nodes_at: NodeAnswers, coordinates_at: CoordinateAnswers | None = None,
               bins_at: BinAnswers | None = None, n=None, copies: int = 1) -> list[np.ndarray]:
        """The tree release: noisy counts of every data-holding node, per level (float64); the root
        is n itself under substitution (public), noised under add/remove when released, NaN when not
        released."""
        levels = []
        for level in range(self.shape.height + 1):
            if level in self.released_levels():
                levels.append(np.asarray(nodes_at(level), dtype=np.float64))
            else:  # only ever the root: consistency does without it
                levels.append(np.full((self.level_nodes(level),) + levels[-1].shape[1:], np.nan))
        return levels

    def noisy_nodes(self, prefix: np.ndarray, noise: NoiseFn) -> list[np.ndarray]:
        """The central tree release (`gather`) of exact prefix counts with `noise`."""
        return self.noisy(prefix, noise)

    def elements(self, release: list[np.ndarray]) -> list[list[np.ndarray]]:
        if release[0].ndim == 1:
            return [release]
        return [[lv[:, e] for lv in release] for e in range(release[0].shape[1])]

    def estimate(self, release: list[np.ndarray], copies: int = 1) -> tuple[np.ndarray, np.ndarray]:
        return self.covering_prefix(release), self.consistent(release, copies)

    def covering_prefix(self, nodes: list[np.ndarray]) -> np.ndarray:
        """The covering estimator at every index: sum of the covering nodes' noisy counts."""
        b, h = self.shape.branching, self.shape.height
        c = np.arange(1, self.size + 1, dtype=np.int64)
        est = np.zeros(self.size)
        full = b**h
        if self.size == full:
            est[-1] = nodes[h][0]
            c, est_view = c[:-1], est[:-1]
        else:
            est_view = est
        start = np.zeros_like(c)
        for level in range(h - 1, -1, -1):
            width = b**level
            digit = (c - start) // width
            cums = np.concatenate([[0.0], np.cumsum(nodes[level])])
            first = start // width
            est_view += cums[first + digit] - cums[first]
            start = start + digit * width
        return est

    def consistent(self, nodes: list[np.ndarray], copies: int = 1, threshold: float | None = None,
                   weight: float = 1e-3, relative: float | None = None) -> np.ndarray:
        """Least-squares consistent leaf counts (Hay et al. 2010, with per-level variances as in
        Honaker 2015): inverse-variance merges bottom-up, then the parents' surplus is split among
        the children in proportion to their variances top-down. Returns prefix counts. `copies`:
        how many independent noises each node carries (2 over two servers). Linear in the node counts
        (without `threshold`): each level may also be a (nodes, B) array of B releases at once.

        `threshold` = tau (the data-adaptive fit for sparse data, `postprocess_with="sparse"`): in the
        top-down pass a child is taken as empty when its bottom-up estimate e lies within tau sd of
        zero (|e| <= tau sd, sd its own noise sd: a fixed, data-independent multiple of the noise)
        and at least `relative` sd (default tau) below an even share of its parent's total, or when
        its parent was taken as empty. An empty child's estimate is 0 and its share of the parent's
        surplus is scaled by `weight`: a tiny weight, not a hard zero, so the parent's total is
        always kept (the earlier hard zeroing of subtrees lost it). Pure post-processing of the
        released node counts: no privacy cost.
        """
        b, h = self.shape.branching, self.shape.height
        var = self.variances() * copies
        if threshold is not None and nodes[0].ndim > 1:
            raise ParameterError("the sparse fit takes one release at a time")
        col = (lambda x: x) if nodes[0].ndim == 1 else (lambda x: x[:, None])  # node weights against a batch's columns
        est, evar = [nodes[0].copy()], [np.full(len(nodes[0]), var[0])]
        for level in range(1, h + 1):
            size = len(nodes[level])
            s = _group_sum(est[-1], b, size)
            v = _group_sum(evar[-1], b, size)
            if level not in self.released_levels():  # no observation: the children's sum alone
                e_l, v_l = s, v
            elif var[level] == 0:
                e_l, v_l = nodes[level].copy(), np.zeros(size)
            else:
                w_own, w_kids = 1 / var[level], np.where(v > 0, 1 / np.maximum(v, 1e-300), np.inf)
                e_l = np.where(col(np.isinf(w_kids)), s, (nodes[level] * w_own + s * col(w_kids)) / col(w_own + w_kids))
                v_l = np.where(np.isinf(w_kids), 0.0, 1 / (w_own + w_kids))
            est.append(e_l)
            evar.append(v_l)
        final = est[h]
        zero = np.zeros(len(final), bool)  # nodes taken as empty (adaptive fit only)
        for level in range(h - 1, -1, -1):
            size = len(est[level])
            parent = np.repeat(final, b, axis=0)[:size]
            e_l, w_l = est[level], evar[level]
            if threshold is not None:
                kids = np.repeat(_group_sum(np.ones(size), b, len(final)), b)[:size]
                sd = threshold * np.sqrt(w_l)
                small = np.repeat(zero, b)[:size] | ((np.abs(e_l) <= sd) & (parent / kids - e_l >= (threshold if relative is None else relative) * np.sqrt(w_l)))
                e_l, w_l, zero = np.where(small, 0.0, e_l), np.where(small, weight * w_l, w_l), small
            s = np.repeat(_group_sum(e_l, b, len(final)), b, axis=0)[:size]
            v = np.repeat(_group_sum(w_l, b, len(final)), b)[:size]
            share = np.where(v > 0, w_l / np.where(v > 0, v, 1), 0.0)
            final = e_l + col(share) * (parent - s)
        return np.cumsum(final, axis=0)

    def expected_mse(self) -> float:
        """Exact expected squared error per prefix of the covering estimator."""
        return float((self.shape.covering_counts() * self.variances()).sum() / self.size)

    def _describe(self) -> str:
        budgets = ", ".join(f"{e:.3g}" for e in self.budgets or ())  # (set by __post_init__)
        return (f"tree mechanism, branching {self.branching}, height {self.shape.height}, "
                f"level budgets [{budgets}] leaves first")


def _group_sum(values: np.ndarray, b: int, groups: int) -> np.ndarray:
    """Sums of consecutive runs of b entries along axis 0 (zero-padded to groups * b)."""
    padded = np.zeros((groups * b,) + values.shape[1:])
    padded[: len(values)] = values
    return padded.reshape((groups, b) + values.shape[1:]).sum(axis=1)
