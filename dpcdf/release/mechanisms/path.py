"""The paper's path mechanism (eq. 2): every node on a leaf's path to the root."""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ...errors import ParameterError
from ..noise import check_epsilon, dlaplace_variance, scale_fraction
from ..tree import TreeShape, path_sensitivity
from .accounting import check_relation
from .base import Answers, BinAnswers, CoordinateAnswers, Mechanism, NodeAnswers, NoiseFn, array_elements

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
