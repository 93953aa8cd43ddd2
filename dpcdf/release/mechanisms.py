"""Tree-structured noise for prefix counts, each mechanism with its privacy guarantee in code.

Neighbouring datasets (`relation`):
- "substitution": one person's value changes, n stays public (the paper's model). A prefix-count
  vector then changes by -1 or +1 on one interval [a, b).
- "add-remove": one person joins or leaves. A prefix-count vector changes by 1 on a suffix [a, N).

Both mechanisms add, to the exact prefix count at index i, a sum of per-node discrete Laplace noises
over a set of tree nodes S(i); the noise of a node is fixed (drawn once, or derived from a server's
PRF seed), so answering any number of queries costs nothing more. `epsilon_for(relation)` is the
guarantee the calibrated mechanism gives under either relation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np

from ..errors import ParameterError
from .noise import dlaplace_variance, scale_fraction
from .tree import TreeShape, path_sensitivity

RELATIONS = ("substitution", "add-remove")
NoiseFn = Callable[[np.ndarray, Fraction], np.ndarray]  # (node ids, scale) -> int64 noise


def check_relation(relation: str) -> str:
    if relation not in RELATIONS:
        raise ParameterError(f"relation must be one of {RELATIONS}, got {relation!r}")
    return relation


def check_epsilon(epsilon: object) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon <= 0:
        raise ParameterError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def node_counts(prefix: np.ndarray, shape: TreeShape, level: int) -> np.ndarray:
    """Exact counts of the level's nodes that hold data, from the prefix counts."""
    width = shape.branching**level
    ends = np.minimum(np.arange(width, shape.size + width, width), shape.size) - 1
    totals = prefix[ends]
    return np.diff(np.concatenate([[0], totals])).astype(np.int64)


@dataclass
class PathMechanism:
    """The paper's eq. 2: prefix count at leaf i plus the noise of every node on i's path to the
    root of a binary tree over the grid (L + 1 nodes, L = ceil(log2 N)).

    Privacy: epsilon-DP under `relation` when every node's noise is DLap(s / epsilon), s the exact
    sensitivity: the fewest signed unit node shifts that explain a neighbour's change, which is L
    under substitution and ceil((L + 1) / 2) under add/remove (Theorem 3.1 of the paper uses L + 1;
    `calibration="paper"` reproduces that). Expected squared error per prefix: (L + 1) Var(DLap).
    """

    size: int
    epsilon: float
    relation: str = "substitution"
    calibration: str = "exact"
    shape: TreeShape = field(init=False)
    scale: Fraction = field(init=False)

    def __post_init__(self) -> None:
        self.epsilon = check_epsilon(self.epsilon)
        check_relation(self.relation)
        if self.calibration not in ("exact", "paper"):
            raise ParameterError(f"calibration must be 'exact' or 'paper', got {self.calibration!r}")
        self.shape = TreeShape.for_size(self.size, 2)
        self.scale = scale_fraction(self.sensitivity(self.relation), self.epsilon)

    name = "path"

    def sensitivity(self, relation: str) -> int:
        if self.calibration == "paper":
            return self.shape.height + 1
        return path_sensitivity(self.shape.height, check_relation(relation))

    def epsilon_for(self, relation: str) -> float:
        """The guarantee under `relation` of the noise as calibrated (its scale is fixed)."""
        return path_sensitivity(self.shape.height, check_relation(relation)) / float(self.scale)

    def nodes_for(self, leaves: np.ndarray) -> np.ndarray:
        """(len(leaves), L + 1) node ids whose noise goes into each prefix."""
        return self.shape.path(leaves)

    def prefix_noise(self, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """The noise eq. 2 adds to the prefix count at each index: the sum over its path's nodes."""
        ids = self.nodes_for(np.asarray(indices, np.int64))
        unique, inverse = np.unique(ids, return_inverse=True)
        return noise(unique, self.scale)[inverse.reshape(ids.shape)].sum(axis=1)

    def noisy_prefix(self, prefix: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """Eq. 2 at every grid index: exact prefix counts (int64) + path noise."""
        return prefix.astype(np.int64) + self.prefix_noise(np.arange(self.size), noise)

    def expected_mse(self) -> float:
        return (self.shape.height + 1) * dlaplace_variance(self.scale)

    def statement(self) -> str:
        return (f"{self.epsilon_for(self.relation):g}-DP under {self.relation} "
                f"(path mechanism, binary tree of height {self.shape.height}, node noise DLap({float(self.scale):.4g}))")


@dataclass
class TreeMechanism:
    """A level-uniform b-ary tree (the optimal-tree paper, Def. IV.1): every node below the root
    gets a noisy count, DLap(Delta / eps_l) at level l with sum_l eps_l = epsilon; a prefix is the sum
    of its covering nodes (Lemma IV.1), and `consistent` post-processes all node counts at once.

    Privacy: epsilon-DP under `relation`: one person moves one unit between two nodes of a level
    (Delta = 2, substitution) or adds/removes one unit at one node of every level (Delta = 1,
    add/remove, where the root, i.e. n, is noised as well since it is not public). Levels compose.
    Default branching factor and level budgets minimise the exact expected squared error of the
    covering estimator for this grid size (budgets proportional to n_l^(1/3), Theorem IV.2).
    """

    size: int
    epsilon: float
    relation: str = "substitution"
    branching: int | None = None
    budgets: tuple[float, ...] | None = None
    shape: TreeShape = field(init=False)
    scales: list[Fraction | None] = field(init=False)

    name = "tree"

    def __post_init__(self) -> None:
        self.epsilon = check_epsilon(self.epsilon)
        check_relation(self.relation)
        if self.branching is None:
            best = min(_candidates(self.size), key=lambda b: _plan(self.size, b, self.epsilon, self.relation)[1])
            self.branching = best
        self.shape = TreeShape.for_size(self.size, self.branching)
        noised = self.noised_levels()
        if self.budgets is None:
            self.budgets = _plan(self.size, self.branching, self.epsilon, self.relation)[0]
        if len(self.budgets) != len(noised) or min(self.budgets) <= 0:
            raise ParameterError(f"need {len(noised)} positive level budgets, got {self.budgets}")
        delta = self.level_sensitivity(self.relation)
        self.scales = [None] * (self.shape.height + 1)
        for level, eps_l in zip(noised, self.budgets):
            self.scales[level] = scale_fraction(delta, eps_l)
        # exactly, with the budgets as the sampler uses them (each rounded down to a rational)
        if sum(delta / self.scales[level] for level in noised) > Fraction(self.epsilon):
            raise ParameterError(f"level budgets {self.budgets} exceed epsilon {self.epsilon}")

    def noised_levels(self) -> list[int]:
        """Levels with noisy counts: all below the root; the root too under add/remove, but only when
        a prefix's covering uses it (the grid fills the padded tree), since n is not public there."""
        return list(range(self.shape.height)) + ([self.shape.height] if self._root_noised() else [])

    def _root_noised(self) -> bool:
        return self.relation == "add-remove" and self.size == self.shape.branching**self.shape.height

    def released_levels(self) -> list[int]:
        """Levels whose counts are released: the noised ones, plus the root when it is public (n)."""
        return self.noised_levels() + ([self.shape.height] if self.relation == "substitution" else [])

    @staticmethod
    def level_sensitivity(relation: str) -> int:
        return 2 if check_relation(relation) == "substitution" else 1

    def epsilon_for(self, relation: str) -> float:
        """Substitution: the sum over noised levels of 2 / scale_l. Add/remove needs a noised root,
        so a tree calibrated for substitution gives no add/remove guarantee (inf)."""
        if relation == "add-remove" and self.relation == "substitution":
            return math.inf
        delta = self.level_sensitivity(relation)
        return sum(delta / float(s) for s in self.scales if s is not None)

    def variances(self) -> np.ndarray:
        """Noise variance per level (0 for the exact root)."""
        return np.array([0.0 if s is None else dlaplace_variance(s) for s in self.scales])

    def node_noise(self, level: int, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """The noise of nodes (level, index); zero at an exact (public) root."""
        idx = np.asarray(indices, np.int64)
        if self.scales[level] is None:
            return np.zeros(idx.size, np.int64)
        return noise(self.shape.node_id(np.full(idx.size, level), idx), self.scales[level])

    def node_bounds(self, level: int) -> tuple[np.ndarray, np.ndarray]:
        """First and last grid index of every data-holding node of a level."""
        width = self.shape.branching**level
        starts = np.arange(0, self.size, width)
        return starts, np.minimum(starts + width, self.size) - 1

    def noisy_nodes(self, prefix: np.ndarray, noise: NoiseFn) -> list[np.ndarray]:
        """Noisy counts of every data-holding node, per level; the root is n itself under
        substitution (public), noised under add/remove when released, NaN when not released."""
        out = []
        for level in range(self.shape.height + 1):
            counts = node_counts(prefix, self.shape, level)
            if level not in self.released_levels():
                out.append(np.full(counts.size, np.nan))
                continue
            out.append((counts + self.node_noise(level, np.arange(counts.size), noise)).astype(np.float64))
        return out

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

    def consistent(self, nodes: list[np.ndarray], copies: int = 1) -> np.ndarray:
        """Least-squares consistent leaf counts (Hay et al. 2010, with per-level variances as in
        Honaker 2015): inverse-variance merges bottom-up, then the parents' surplus is split among
        the children in proportion to their variances top-down. Returns prefix counts. `copies`:
        how many independent noises each node carries (2 over two servers)."""
        b, h = self.shape.branching, self.shape.height
        var = self.variances() * copies
        est, evar = [nodes[0].copy()], [np.full(nodes[0].size, var[0])]
        for level in range(1, h + 1):
            s = _group_sum(est[-1], b, nodes[level].size)
            v = _group_sum(evar[-1], b, nodes[level].size)
            if level not in self.released_levels():  # no observation: the children's sum alone
                e_l, v_l = s, v
            elif var[level] == 0:
                e_l, v_l = nodes[level].copy(), np.zeros(nodes[level].size)
            else:
                w_own, w_kids = 1 / var[level], np.where(v > 0, 1 / np.maximum(v, 1e-300), np.inf)
                e_l = np.where(np.isinf(w_kids), s, (nodes[level] * w_own + s * w_kids) / (w_own + w_kids))
                v_l = np.where(np.isinf(w_kids), 0.0, 1 / (w_own + w_kids))
            est.append(e_l)
            evar.append(v_l)
        final = est[h]
        for level in range(h - 1, -1, -1):
            parent = np.repeat(final, b)[: est[level].size]
            s = np.repeat(_group_sum(est[level], b, final.size), b)[: est[level].size]
            v = np.repeat(_group_sum(evar[level], b, final.size), b)[: est[level].size]
            share = np.where(v > 0, evar[level] / np.where(v > 0, v, 1), 0.0)
            final = est[level] + share * (parent - s)
        return np.cumsum(final)

    def expected_mse(self) -> float:
        """Exact expected squared error per prefix of the covering estimator."""
        return float((self.shape.covering_counts() * self.variances()).sum() / self.size)

    def statement(self) -> str:
        eps = self.epsilon_for(self.relation)
        budgets = ", ".join(f"{e:.3g}" for e in self.budgets)
        return (f"{eps:g}-DP under {self.relation} (tree mechanism, branching {self.branching}, height "
                f"{self.shape.height}, level budgets [{budgets}] leaves first)")


def _group_sum(values: np.ndarray, b: int, groups: int) -> np.ndarray:
    padded = np.zeros(groups * b)
    padded[: values.size] = values
    return padded.reshape(groups, b).sum(axis=1)


def _candidates(size: int) -> list[int]:
    return sorted(set(range(2, min(size, 64) + 1)) | {size})


def _plan(size: int, b: int, epsilon: float, relation: str) -> tuple[tuple[float, ...], float]:
    """Level budgets minimising sum_l n_l * 2 (Delta / eps_l)^2 under sum eps_l = epsilon (eps_l
    proportional to n_l^(1/3)), and the resulting expected squared error per prefix."""
    shape = TreeShape.for_size(size, b)
    root_noised = relation == "add-remove" and size == b**shape.height
    top = shape.height + (1 if root_noised else 0)
    n_l = shape.covering_counts()[:top].astype(np.float64)
    weights = np.cbrt(np.maximum(n_l, 1e-9))
    budgets = epsilon * (1 - 1e-12) * weights / weights.sum()  # the margin keeps the exact float sum <= epsilon
    delta = 2 if relation == "substitution" else 1
    mse = float((n_l * 2 * (delta / budgets) ** 2).sum() / size)
    return tuple(float(e) for e in budgets), mse
