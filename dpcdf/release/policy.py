"""The one policy table: what `mechanism="auto"` means, and how each payload spends its budget.

`release_ecdf` (central), `TaskConfig` (the two servers' tasks and `dpcdf task`) and the applications
(ROC, Hosmer-Lemeshow) all read it, so a central release and a two-server task on the same inputs pick
the same mechanism and the same per-curve budget. A choice made here from public parameters (grid
size, epsilon or rho, relation, payload) is post-processing of nothing private: it costs no privacy.

| privacy | relation     | "auto" picks                                                           |
|---------|--------------|------------------------------------------------------------------------|
| pure    | substitution | adaptive, on grids of >= MIN_ADAPTIVE_GRID points and epsilon >=       |
|         |              | MIN_ADAPTIVE_EPSILON; else the b-ary tree                              |
| pure    | add-remove   | the b-ary tree (the adaptive design needs n public)                    |
| zcdp    | either       | the square-root factorization on 2..MAX_FACTOR_GRID points; else the   |
|         |              | Gaussian tree                                                          |

| payload     | curves released                   | epsilon (or rho) of each curve, relation            |
|-------------|-----------------------------------|-----------------------------------------------------|
| count       | one ECDF                          | all of it, the task's relation                      |
| label       | the ECDF of each class (ROC)      | half of it, add-remove (a person is in one class;   |
|             |                                   | the class sizes are not public)                     |
| calibration | the ECDF of the probabilities,    | `split` of it for the ECDF, the rest for the group  |
|             | then the groups' sums (HL)        | sums (`calibration.group_scales`)                   |
"""
from __future__ import annotations

from .adaptive import MIN_ADAPTIVE_EPSILON, MIN_ADAPTIVE_GRID
from .factorization import MAX_FACTOR_GRID


def auto_mechanism(size: int, relation: str, privacy: str = "pure", epsilon: float | None = None) -> str:
    """The mechanism "auto" stands for (the first table above). `epsilon=None`: not yet known, taken
    as large enough for the adaptive design."""
    if privacy == "zcdp":
        return "factorization" if 2 <= size <= MAX_FACTOR_GRID else "tree"
    small = epsilon is not None and epsilon < MIN_ADAPTIVE_EPSILON
    return "adaptive" if relation == "substitution" and size >= MIN_ADAPTIVE_GRID and not small else "tree"


def curve_budget(payload: str, budget: float, relation: str, split: float = 0.5) -> tuple[float, str]:
    """(budget, relation) of each ECDF a payload releases (the second table above); `budget` is the
    task's epsilon, or rho under zCDP."""
    if payload == "label":
        return budget / 2, "add-remove"
    if payload == "calibration":
        return budget * split, relation
    return budget, relation
