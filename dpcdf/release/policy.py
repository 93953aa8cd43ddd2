"""The one policy table: what `mechanism="auto"` means, and how each payload spends its budget.

`release_ecdf` (central), `TaskConfig` (the two servers' tasks and `dpcdf task`) and the applications
(ROC, Hosmer-Lemeshow) all read it, so a central release and a two-server task on the same inputs pick
the same mechanism and the same per-curve budget. A choice made here from public parameters (grid
size, epsilon or rho, relation, payload) is post-processing of nothing private: it costs no privacy.

| privacy | payload     | relation     | "auto" picks                                                |
|---------|-------------|--------------|-------------------------------------------------------------|
| pure    | count       | either       | adaptive, on grids of >= MIN_ADAPTIVE_GRID points and       |
|         |             |              | epsilon >= min_adaptive_epsilon(relation); else the tree    |
| zcdp    | count       | either       | the square-root factorization on 2..MAX_FACTOR_GRID points; |
|         |             |              | else the Gaussian tree                                      |
| either  | label,      | either       | the tree (pure: the b-ary tree without a root share; zcdp:  |
|         | calibration |              | the Gaussian tree): the servers answer groups and both      |
|         |             |              | classes' curves from prefixes and nodes                     |

| payload     | curves released                   | epsilon (or rho) of each curve, relation            |
|-------------|-----------------------------------|-----------------------------------------------------|
| count       | one ECDF                          | all of it, the task's relation                      |
| label       | the ECDF of each class (ROC)      | half of it, add-remove (a person is in one class;   |
|             |                                   | the class sizes are not public)                     |
| calibration | the ECDF of the probabilities,    | `split` of it for the ECDF, the rest for the group  |
|             | then the groups' sums (HL)        | sums (`calibration.group_scales`: a third each to   |
|             |                                   | n, O and E)                                         |

The second table holds for both kinds of privacy, because both compose additively: epsilons under
pure DP, rhos under zCDP (Bun and Steinke 2016, Lemma 2.3). So a label task at rho releases two
rho/2-zCDP (add/remove) curves: rho/2-zCDP under add/remove (a person is in one curve) and rho-zCDP
under substitution (the Gaussian tree's L2 sensitivity for one value moved within a curve is twice its
add/remove one, and a move across curves is one removal and one addition). A calibration task at rho
releases a split*rho-zCDP ECDF and three (1 - split)*rho/3-zCDP discrete Gaussian group vectors:
rho-zCDP under substitution. rho-zCDP implies (rho + 2 sqrt(rho log(1/delta)), delta)-DP for every
delta in (0, 1) (`zcdp.zcdp_to_dp`).
"""
from __future__ import annotations

from ..errors import ParameterError
from .adaptive import MIN_ADAPTIVE_GRID, min_adaptive_epsilon
from .factorization import MAX_FACTOR_GRID
from .mechanisms import check_epsilon
from .payload import Payload
from .zcdp import check_rho


def auto_mechanism(size: int, relation: str, privacy: str = "pure", epsilon: float | None = None,
                   payload: str = "count") -> str:
    """The mechanism "auto" stands for (the first table above). `epsilon=None`: not yet known, taken
    as large enough for the adaptive design."""
    if not Payload.parse(payload).plain:
        return "tree"
    if privacy == "zcdp":
        return "factorization" if 2 <= size <= MAX_FACTOR_GRID else "tree"
    small = epsilon is not None and epsilon < min_adaptive_epsilon(relation)
    return "adaptive" if size >= MIN_ADAPTIVE_GRID and not small else "tree"


def curve_budget(payload: str, budget: float, relation: str, split: float = 0.5) -> tuple[float, str]:
    """(budget, relation) of each ECDF a payload releases (the second table above); `budget` is the
    task's epsilon, or rho under zCDP."""
    kind = Payload.parse(payload)
    if kind.roc:  # a person is in one class: each curve add/remove
        return budget / 2, "add-remove"
    if kind.scored:  # the rest goes to the group sums
        return budget * split, relation
    return budget, relation


def check_budget(privacy: str, epsilon: object, rho: object) -> float:
    """The budget of a release that takes (privacy, epsilon, rho) as `release_ecdf` does: epsilon for
    privacy="pure" (no rho), rho for privacy="zcdp" (no epsilon); ParameterError for anything else."""
    if privacy == "zcdp":
        if epsilon is not None:
            raise ParameterError("privacy='zcdp' takes rho, not epsilon")
        return check_rho(rho)
    if privacy == "pure":
        if rho is not None:
            raise ParameterError("rho is for privacy='zcdp'")
        return check_epsilon(epsilon)
    raise ParameterError(f"privacy must be 'pure' or 'zcdp', got {privacy!r}")
