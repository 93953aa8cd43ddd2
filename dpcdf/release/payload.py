"""What each report of a task carries besides its value's comparison: its payload (`Payload`).

A str enum, so a task's JSON, its fingerprint and every stored config hold the same strings as
before ("count", "label", "calibration"), and a member equals its string. The facts that code
branches on are properties here, not comparisons with the strings at each call site:

| payload     | key payload (beta) per value  | width | labelled | curves released                |
|-------------|-------------------------------|-------|----------|--------------------------------|
| count       | 1                             | 1     | no       | one ECDF                       |
| label       | (label, 1 - label)            | 2     | yes      | one ECDF per class (ROC)       |
| calibration | (1, label, q), q = p in 2^-16 | 3     | yes      | the ECDF of the p, and the     |
|             |                               |       |          | groups' sums (Hosmer-Lemeshow) |

How each spends its budget is the policy table's (`policy.py`, `curve_budget`).
"""
from __future__ import annotations

from enum import Enum

import numpy as np

from ..errors import ParameterError


class Payload(str, Enum):
    """A task's payload: count (an ECDF), label (a ROC curve) or calibration (Hosmer-Lemeshow)."""

    COUNT = "count"
    LABEL = "label"
    CALIBRATION = "calibration"

    __str__ = str.__str__  # "label", in messages and f-strings, on every Python version
    __format__ = str.__format__  # type: ignore[assignment]  # str's own (its argument positional-only)

    @classmethod
    def get(cls, value: object) -> "Payload | None":
        """The payload named `value` (a member or its string), None for anything else."""
        try:
            return cls(value)
        except (ValueError, TypeError):
            return None

    @classmethod
    def parse(cls, value: object) -> "Payload":
        """The payload named `value` (a member or its string); ParameterError for anything else."""
        kind = cls.get(value)
        if kind is None:
            raise ParameterError(f"payload must be 'count' (an ECDF), 'label' (a ROC curve) or 'calibration' "
                                 f"(Hosmer-Lemeshow), got {value!r}")
        return kind

    @property
    def width(self) -> int:
        """Field elements (or ring elements) each key's payload vector has: 1, 2 or 3."""
        return _WIDTH[self]

    @property
    def labelled(self) -> bool:
        """Whether each value comes with its 0/1 label (label and calibration tasks)."""
        return self is not Payload.COUNT

    @property
    def plain(self) -> bool:
        """Whether the task releases one ECDF and nothing besides (count): only such a task may use the
        mechanisms that release one ECDF (adaptive, the square-root factorization) and the add/remove
        root share; the others keep the tree, whose prefixes and nodes answer both classes' curves and
        the groups."""
        return self is Payload.COUNT

    @property
    def roc(self) -> bool:
        """Whether the task releases two curves, one per class (a ROC curve) rather than one ECDF."""
        return self is Payload.LABEL

    @property
    def scored(self) -> bool:
        """Whether each report also carries a score, a probability q in fixed point (calibration): the
        servers answer the groups' sums (n, labels, scores) besides the ECDF of the probabilities,
        their other queries answer that ECDF only, and the report check adds the score's and q's range
        sub-checks."""
        return self is Payload.CALIBRATION

    @property
    def verifiable(self) -> bool:
        """Whether the servers can check this payload's reports (every payload so far)."""
        return True

    def betas(self, values: np.ndarray, labels: object = None) -> np.ndarray | int:
        """Each report's payload vector from its value and label (the table above): 1 for a count task
        (no labels), else an int64 array (n, width); ParameterError if the labels are missing, not 0/1,
        given to a count task, or a calibration value is no probability."""
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if not self.labelled:
            if labels is not None:
                raise ParameterError("labels belong to label tasks")
            return 1
        y = np.asarray(labels).reshape(-1) if labels is not None else None
        if y is None or y.size != v.size or not np.isin(y, [0, 1]).all():
            raise ParameterError(f"a {self} task needs one label (0 or 1) per value")
        if not self.scored:
            return np.stack([y, 1 - y], axis=1).astype(np.int64)
        if (v < 0).any() or (v > 1).any():
            raise ParameterError("a calibration task's values are probabilities in [0, 1]")
        from .calibration import fixed_point  # (loads numba: only where it is needed)

        return np.stack([np.ones_like(y), y, fixed_point(v).astype(np.int64)], axis=1).astype(np.int64)


_WIDTH = {Payload.COUNT: 1, Payload.LABEL: 2, Payload.CALIBRATION: 3}
