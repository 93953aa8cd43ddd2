"""Tree-structured noise for prefix counts, each mechanism with its privacy guarantee in code.

Neighbouring datasets (`relation`):
- "substitution": one person's value changes, n stays public (the paper's model). A prefix-count
  vector then changes by -1 or +1 on one interval [a, b).
- "add-remove": one person joins or leaves. A prefix-count vector changes by 1 on a suffix [a, N).

Both mechanisms add, to the exact prefix count at index i, a sum of per-node discrete Laplace noises
over a set of tree nodes S(i); the noise of a node is fixed (drawn once, or derived from a server's
PRF seed), so answering any number of queries costs nothing more. `epsilon_for(relation)` is the
guarantee the calibrated mechanism gives under either relation.

Both implement `Mechanism` (`base`), so callers (the central release, a server's aggregation, the
analyst) call methods instead of asking which mechanism they hold. One mechanism per module (`path`,
`tree`); the accounting they share (relations, rounding, the tree's budget plan) in `accounting`.
"""
from ..noise import check_epsilon
from .accounting import RELATIONS, ROOT_SHARE, check_relation, tree_plan
from .base import Answers, BinAnswers, CoordinateAnswers, Mechanism, NodeAnswers, NoiseFn, array_elements, node_counts
from .path import PathMechanism
from .tree import TreeMechanism

__all__ = ["Answers", "BinAnswers", "CoordinateAnswers", "Mechanism", "NodeAnswers", "NoiseFn", "PathMechanism", "RELATIONS",
           "ROOT_SHARE", "TreeMechanism", "array_elements", "check_epsilon", "check_relation", "node_counts", "tree_plan"]
