"""Tree-structured noise for prefix counts, each mechanism with its privacy guarantee in code.

Neighbouring datasets (`relation`):
- "substitution": one person's value changes, n stays public (the paper's model). A prefix-count
  vector then changes by -1 or +1 on one interval [a, b).
- "add-remove": one person joins or leaves. A prefix-count vector changes by 1 on a suffix [a, N).

Both mechanisms add, to the exact prefix count at index i, a sum of per-node discrete Laplace noises
over a set of tree nodes S(i); the noise of a node is fixed (drawn once, or derived from a server's
PRF seed), so answering any number of queries costs nothing more. `epsilon_for(relation)` is the
guarantee the calibrated mechanism gives under either relation.

Both implement `Mechanism`, so callers (the central release, a server's aggregation, the analyst)
call methods instead of asking which mechanism they hold.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Callable

import numpy as np

from ..errors import ParameterError
from .noise import EPSILON_ROUNDING, check_epsilon, dlaplace_variance, scale_fraction  # noqa: F401 (check_epsilon: re-exported)
from .tree import TreeShape, path_sensitivity

RELATIONS = ("substitution", "add-remove")
NoiseFn = Callable[[np.ndarray, Fraction], np.ndarray]  # (node ids, scale) -> int64 noise
Answers = Callable[[np.ndarray], np.ndarray]  # grid indices -> noisy prefix counts
NodeAnswers = Callable[[int], np.ndarray]  # level -> noisy counts of its data-holding nodes
CoordinateAnswers = Callable[[], np.ndarray]  # () -> a factorization's noisy coordinates R x + z (then n)
BinAnswers = Callable[[int, np.ndarray], np.ndarray]  # (round, bin ends) -> an adaptive release's noisy bin counts


def check_relation(relation: str) -> str:
    if relation not in RELATIONS:
        raise ParameterError(f"relation must be one of {RELATIONS}, got {relation!r}")
    return relation


ROOT_SHARE = 0.2
"""Under add/remove the root (n) gets this fixed share of epsilon, the levels below the rest. Every
quantile and ECDF value divides by the estimate of n, and after smoothing and the monotone fit every
prefix past the data's support equals it: with the root's share proportional to its covering count
(1 or 0) the estimate's sd was 127 at eps 0.1 on 2^10 points against 46 for OpenDP's b = 16 tree, and
this share cut the counts MSE by 1.4 to 3x on skewed and sparse data (docs/accuracy.md)."""


def array_elements(release: np.ndarray) -> list[np.ndarray]:
    """A release that is one array (path, factorization): one per column of its trailing payload axis."""
    return [release] if release.ndim == 1 else [release[:, e] for e in range(release.shape[1])]


def node_counts(prefix: np.ndarray, shape: TreeShape, level: int) -> np.ndarray:
    """Exact counts of the level's nodes that hold data, from the prefix counts."""
    width = shape.branching**level
    ends = np.minimum(np.arange(width, shape.size + width, width), shape.size) - 1
    totals = prefix[ends]
    return np.diff(np.concatenate([[0], totals])).astype(np.int64)


class Mechanism(ABC):
    """What the path and tree mechanisms both offer. A mechanism adds to prefix counts the noise of
    tree nodes, each node's noise drawn once (`noise(node ids, scale)`), and releases either noisy
    prefix counts (path) or noisy node counts per level (tree): its *release*, which `estimate`
    turns into prefix-count estimates. Everything after the release is post-processing.

    Privacy accounting is exact: every noise scale is a rational, `exact_epsilon` sums what each
    level spends as a Fraction, and that sum never exceeds the epsilon asked for. Rounding each
    budget down to a rational scale (denominator <= 2^20, `noise.scale_fraction`) loses less than
    2^-20 per rounded budget, so `statement` shows the requested epsilon when the exact sum lies
    within `rounding()` below it, and the exact sum (rounded up) otherwise.
    """

    name: str
    size: int
    epsilon: float
    relation: str
    shape: TreeShape

    # --- noise ---------------------------------------------------------------------------------
    @abstractmethod
    def node_noise(self, level: int, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """The noise (int64) of the nodes (level, index), at the level's scale."""

    @abstractmethod
    def prefix_noise(self, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """The noise (int64) the mechanism puts on the prefix count at each grid index."""

    def _indices(self, indices) -> np.ndarray:
        idx = np.asarray(indices, np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise ParameterError(f"grid indices must lie in [0, {self.size})")
        return idx

    # --- the release -------------------------------------------------------------------------
    @abstractmethod
    def released_levels(self) -> list[int]:
        """Tree levels whose node counts are released (none for the path mechanism)."""

    answers_prefixes = True  # whether a server answers noisy prefix counts at any index (not a factorization)

    def coordinate_noise(self, noise: NoiseFn) -> np.ndarray:
        """A factorization's noise on its coordinates R x; the path and tree mechanisms have none."""
        raise ParameterError(f"the {self.name} mechanism has no coordinates to release (a factorization has)")

    @abstractmethod
    def gather(self, prefix_at: Answers, nodes_at: NodeAnswers, coordinates_at: CoordinateAnswers | None = None,
               bins_at: BinAnswers | None = None, n=None, copies: int = 1):
        """The release, asked for through `prefix_at(indices)` (noisy prefix counts), `nodes_at(level)`
        (noisy node counts of a released level), `coordinates_at()` (a factorization's noisy
        coordinates) or `bins_at(round, ends)` (an adaptive release's noisy bin counts, whose second
        round depends on the first, on n (public under substitution; a number or a function giving
        it once asked) and on how many noises (`copies`) each answer carries): the analyst's questions
        to the servers. Arrays may carry a trailing payload axis (one column per released ECDF)."""

    def noisy(self, prefix: np.ndarray, noise: NoiseFn):
        """The central release of exact prefix counts (at every grid index) with `noise`."""
        prefix = np.asarray(prefix).astype(np.int64)
        return self.gather(lambda idx: prefix[idx] + self.prefix_noise(idx, noise), self.central_nodes(prefix, noise))

    def central_nodes(self, prefix: np.ndarray, noise: NoiseFn) -> NodeAnswers:
        """`nodes_at` of a central release: a level's exact node counts (from int64 prefix counts) plus
        each node's noise."""
        return lambda level: (node_counts(prefix, self.shape, level)
                              + self.node_noise(level, np.arange(self.level_nodes(level)), noise)).astype(np.float64)

    @abstractmethod
    def elements(self, release) -> list:
        """One release per payload element (column of the trailing axis), or [release] if none."""

    @abstractmethod
    def estimate(self, release, copies: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(raw, fitted) prefix-count estimates at every grid index from a release whose values carry
        `copies` independent noises each: raw is what the mechanism itself gives (path: the noisy
        prefixes; tree: the covering estimator), fitted the best linear estimate (tree: consistent)."""

    def smoothing_nodes(self) -> np.ndarray:
        """(size, k) node ids of each prefix, for the paper's eq. 3 smoothing (path mechanism only)."""
        raise ParameterError(f"eq. 3 smoothing is defined for the path mechanism, not the {self.name} mechanism "
                             "(a tree release is made consistent instead)")

    def level_nodes(self, level: int) -> int:
        """How many nodes of a level hold data."""
        return -(-self.size // self.shape.branching**level)

    def node_bounds(self, level: int) -> tuple[np.ndarray, np.ndarray]:
        """First and last grid index of every data-holding node of a level."""
        width = self.shape.branching**level
        starts = np.arange(0, self.size, width)
        return starts, np.minimum(starts + width, self.size) - 1

    # --- privacy -----------------------------------------------------------------------------
    @abstractmethod
    def exact_epsilon(self, relation: str) -> Fraction | None:
        """The guarantee under `relation` as an exact rational, None when there is none."""

    @abstractmethod
    def rounded_budgets(self) -> int:
        """How many budgets were each rounded down to a rational noise scale."""

    def rounding(self) -> Fraction:
        """How far below epsilon the exact guarantee may lie and still be stated as epsilon: less than
        2^-20 per rounded budget (`noise.EPSILON_ROUNDING`) plus a relative 1e-9 (the float budget
        split's margin)."""
        return self.rounded_budgets() * EPSILON_ROUNDING + Fraction(self.epsilon) * Fraction(1, 10**9)

    def epsilon_for(self, relation: str) -> float:
        """The guarantee under `relation` of the noise as calibrated (its scales are fixed); inf if none."""
        exact = self.exact_epsilon(check_relation(relation))
        return math.inf if exact is None else float(exact)

    def stated_epsilon(self, relation: str | None = None) -> float:
        """The epsilon a statement gives: the requested one when the exact guarantee is at most it and
        within `rounding()` below it (under the calibrated relation), else the exact one rounded up
        to 6 significant digits (inf when there is no guarantee)."""
        relation = check_relation(self.relation if relation is None else relation)
        exact = self.exact_epsilon(relation)
        if exact is None:
            return math.inf
        requested = Fraction(self.epsilon)
        if relation == self.relation and exact > requested:  # by construction; never state less than is spent
            raise AssertionError(f"the {self.name} mechanism spends {exact} > epsilon {self.epsilon}")
        if relation == self.relation and requested - exact <= self.rounding():
            return self.epsilon
        return _round_up(exact)

    def statement(self, relation: str | None = None) -> str:
        """The privacy guarantee in words, under `relation` (default: the calibrated one). It names the
        requested epsilon when the exact rational guarantee is at most epsilon and within `rounding()`
        below it (the rounding of the budgets to rational noise scales), and says so."""
        relation = check_relation(self.relation if relation is None else relation)
        exact = self.exact_epsilon(relation)
        if exact is None:
            return f"no DP guarantee under {relation} ({self._no_guarantee()}; {self._describe()})"
        shown = self.stated_epsilon(relation)
        if relation == self.relation and exact == Fraction(self.epsilon):
            how = f"epsilon = {shown:g} exactly"
        elif relation == self.relation and shown == self.epsilon:
            k = self.rounded_budgets()
            what = "the budget is" if k == 1 else f"each of the {k} level budgets is"
            how = (f"epsilon = {shown:g} up to rounding: the exact rational accounting gives {_round_up(exact, 10):.10g} "
                   f"<= epsilon, as {what} rounded down by less than 2^-20 to a rational noise scale")
        else:
            how = f"epsilon = {shown:g}: the exact rational accounting {float(exact):.10g}, rounded up"
        return f"{shown:g}-DP under {relation} ({how}; {self._describe()})"

    @abstractmethod
    def _describe(self) -> str: ...

    def _no_guarantee(self) -> str:
        return f"calibrated for {self.relation}"

    @abstractmethod
    def expected_mse(self) -> float:
        """Exact expected squared error per prefix count (one copy of the noise)."""


def _round_up(value: Fraction | float, digits: int = 6) -> float:
    """`value` at `digits` significant digits, rounded up: a stated epsilon is never below the truth
    (compared as the decimal it prints as)."""
    text = f"{float(value):.{digits}g}"
    if Fraction(text) < Fraction(value):
        step = Fraction(10) ** (math.floor(math.log10(float(value))) - digits + 1)
        text = f"{float(Fraction(text) + step):.{digits}g}"
    return float(text)


@dataclass
class PathMechanism(Mechanism):
    """The paper's eq. 2: prefix count at leaf i plus the noise of every node on i's path to the
    root of a binary tree over the grid (L + 1 nodes, L = ceil(log2 N)).

    Privacy: epsilon-DP under `relation` when every node's noise is DLap(s / epsilon), s the exact
    sensitivity: the fewest signed unit node shifts that explain a neighbour's change, which is L
    under substitution and ceil((L + 1) / 2) under add/remove (Theorem 3.1 of the paper uses L + 1;
    `calibration="paper"` reproduces that). Epsilon is rounded down by less than 2^-20 to make the
    scale rational, so the exact guarantee is at most epsilon (`statement` says by how much).
    Expected squared error per prefix: (L + 1) Var(DLap).
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

    def exact_epsilon(self, relation: str) -> Fraction:
        """The guarantee under `relation` of the noise as calibrated (its scale is fixed):
        exact sensitivity / scale."""
        return Fraction(path_sensitivity(self.shape.height, check_relation(relation))) / self.scale

    def rounded_budgets(self) -> int:
        return 1

    def nodes_for(self, leaves: np.ndarray) -> np.ndarray:
        """(len(leaves), L + 1) node ids whose noise goes into each prefix."""
        return self.shape.path(leaves)

    def node_noise(self, level: int, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """The noise of the binary tree's nodes (level, index): every node has the same scale."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        return noise(self.shape.node_id(np.full(idx.size, level), idx), self.scale)

    def prefix_noise(self, indices: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """The noise eq. 2 adds to the prefix count at each index: the sum over its path's nodes
        (one call of `noise` for all distinct nodes)."""
        ids = self.nodes_for(self._indices(indices))
        unique, inverse = np.unique(ids, return_inverse=True)
        return noise(unique, self.scale)[inverse.reshape(ids.shape)].sum(axis=1)

    def released_levels(self) -> list[int]:
        return []

    def gather(self, prefix_at: Answers, nodes_at: NodeAnswers, coordinates_at: CoordinateAnswers | None = None,
               bins_at: BinAnswers | None = None, n=None, copies: int = 1) -> np.ndarray:
        """The path release: noisy prefix counts at every grid index."""
        return prefix_at(np.arange(self.size))

    def noisy_prefix(self, prefix: np.ndarray, noise: NoiseFn) -> np.ndarray:
        """Eq. 2 at every grid index: exact prefix counts (int64) + path noise."""
        return self.noisy(prefix, noise)

    def elements(self, release: np.ndarray) -> list[np.ndarray]:
        return array_elements(release)

    def estimate(self, release: np.ndarray, copies: int = 1) -> tuple[np.ndarray, np.ndarray]:
        raw = np.asarray(release, dtype=np.float64)
        return raw, raw

    def smoothing_nodes(self) -> np.ndarray:
        return self.nodes_for(np.arange(self.size))

    def expected_mse(self) -> float:
        return (self.shape.height + 1) * dlaplace_variance(self.scale)

    def _describe(self) -> str:
        return f"path mechanism, binary tree of height {self.shape.height}, node noise DLap({float(self.scale):.4g})"


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
        # exactly, with the budgets as the sampler uses them (each rounded down to a rational)
        if sum(delta / self.scales[level] for level in noised) > Fraction(self.epsilon):
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
        if self.scales[level] is None:
            return np.zeros(idx.size, np.int64)
        return noise(self.shape.node_id(np.full(idx.size, level), idx), self.scales[level])

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

    def gather(self, prefix_at: Answers, nodes_at: NodeAnswers, coordinates_at: CoordinateAnswers | None = None,
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
        budgets = ", ".join(f"{e:.3g}" for e in self.budgets)
        return (f"tree mechanism, branching {self.branching}, height {self.shape.height}, "
                f"level budgets [{budgets}] leaves first")


def _group_sum(values: np.ndarray, b: int, groups: int) -> np.ndarray:
    """Sums of consecutive runs of b entries along axis 0 (zero-padded to groups * b)."""
    padded = np.zeros((groups * b,) + values.shape[1:])
    padded[: len(values)] = values
    return padded.reshape((groups, b) + values.shape[1:]).sum(axis=1)


def _candidates(size: int) -> list[int]:
    return sorted(set(range(2, min(size, 64) + 1)) | {size})


@lru_cache(maxsize=1024)
def tree_plan(size: int, epsilon: float, relation: str, branching: int | None = None,
              root_share: float = ROOT_SHARE) -> tuple[int, tuple[float, ...]]:
    """The branching factor (the given one, else the candidate of least expected error) and its level
    budgets (`_plan`). Pure and cached: a server builds a task's mechanism at registration, at every
    load and per config parse, and the same (size, epsilon, relation) is planned once per process."""
    if branching is None:
        branching = min(_candidates(size), key=lambda b: _plan(size, b, epsilon, relation, root_share)[1])
    return branching, _plan(size, branching, epsilon, relation, root_share)[0]


def _covering_counts(size: int, b: int, height: int) -> np.ndarray:
    """`TreeShape.covering_counts` in closed form, O(height) integer steps instead of O(size * height)
    array work: n_l is the sum of the base-b digit l of c over the prefix lengths c = 1..size (the
    whole padded domain is the root alone). Digit l of c runs 0..b-1, each for b^l consecutive c."""
    counts = [0] * (height + 1)
    last = size
    if size == b**height:
        counts[height], last = 1, size - 1
    for level in range(height):
        p = b**level
        q, r = divmod(last + 1, p * b)  # c in [0, last]: q whole digit cycles, then r values
        d = r // p
        counts[level] = q * p * (b * (b - 1) // 2) + p * (d * (d - 1) // 2) + d * (r - d * p)
    return np.array(counts, np.int64)


def _plan(size: int, b: int, epsilon: float, relation: str, root_share: float = ROOT_SHARE) -> tuple[tuple[float, ...], float]:
    """Level budgets minimising sum_l n_l * 2 (Delta / eps_l)^2 under sum eps_l = epsilon (eps_l
    proportional to n_l^(1/3)) over the levels below the root, plus under add/remove the root's fixed
    `root_share` (0: the plan before it, where the root is noised only in a full tree, as one more level
    with n_l = 1); and the covering estimator's expected squared error per prefix."""
    shape = TreeShape.for_size(size, b)
    n_l = _covering_counts(size, b, shape.height).astype(np.float64)
    full = size == b**shape.height
    margin = 1 - 1e-12  # keeps the exact float sum <= epsilon
    if relation == "add-remove" and root_share > 0:
        weights = np.cbrt(np.maximum(n_l[: shape.height], 1e-9))
        budgets = np.append(epsilon * (1 - root_share) * margin * weights / weights.sum(), epsilon * root_share * margin)
    else:
        weights = np.cbrt(np.maximum(n_l[: shape.height + (relation == "add-remove" and full)], 1e-9))
        budgets = epsilon * margin * weights / weights.sum()
    delta = 2 if relation == "substitution" else 1
    mse = float((n_l[: budgets.size] * 2 * (delta / budgets) ** 2).sum() / size)
    return tuple(float(e) for e in budgets), mse
