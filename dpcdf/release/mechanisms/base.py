"""`Mechanism`: what every tree-structured noise offers its callers (the central release, a server's
aggregation, the analyst): noise at prefixes and nodes, asking for (in typed queries,
`dpcdf.release.queries`) and estimating a release, and its privacy guarantee under either relation,
stated in code (`exact_epsilon`, `statement`)."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Callable

import numpy as np

from ...errors import ParameterError
from ..noise import EPSILON_ROUNDING
from ..queries import Answer, BinsQuery, CoordinatesQuery, NodesQuery, PrefixQuery
from ..tree import TreeShape
from .accounting import check_relation, round_up

NoiseFn = Callable[[np.ndarray, Fraction], np.ndarray]  # (node ids, scale) -> int64 noise
Answers = Callable[[np.ndarray], np.ndarray]  # grid indices -> noisy prefix counts
NodeAnswers = Callable[..., np.ndarray]  # (level[, whole]) -> noisy counts of its data-holding nodes (`whole`: adaptive)
CoordinateAnswers = Callable[[], np.ndarray]  # () -> a factorization's noisy coordinates R x + z (then n)
BinAnswers = Callable[..., np.ndarray]  # (round, bin ends[, group ends]) -> an adaptive release's noisy bin counts


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

    def ask(self, answer: Answer, n=None, copies: int = 1):
        """The release, asked for in typed queries (`dpcdf.release.queries`) through one function
        `answer(query) -> noisy values`: the analyst's questions to the servers. `n` (public under
        substitution; a number, or a function giving it once asked) and `copies` (how many noises
        each answer carries) as `gather` takes them."""
        return self.gather(lambda indices: answer(PrefixQuery(indices)),
                           lambda level, whole=False: answer(NodesQuery(level, whole or None)),
                           lambda: answer(CoordinatesQuery()),
                           lambda round_, ends, groups=(): answer(BinsQuery(round_, None if round_ in (0, 1) else ends,
                                                                            tuple(groups) or None)),
                           n=n, copies=copies)

    @abstractmethod
    def gather(self, prefix_at: Answers, nodes_at: NodeAnswers, coordinates_at: CoordinateAnswers | None = None,
               bins_at: BinAnswers | None = None, n=None, copies: int = 1):
        """The release, from one callback per query type (callers use `ask`, which makes them from
        one `answer`): `prefix_at(indices)` (noisy prefix counts), `nodes_at(level)` (noisy node
        counts of a released level), `coordinates_at()` (a factorization's noisy coordinates) or
        `bins_at(round, ends, groups)` (an adaptive release's noisy bin counts, whose second round depends on
        the first, on n and on `copies`). Arrays may carry a trailing payload axis (one column per
        released ECDF)."""

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
        return round_up(exact)

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
            how = (f"epsilon = {shown:g} up to rounding: the exact rational accounting gives {round_up(exact, 10):.10g} "
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
