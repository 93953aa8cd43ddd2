"""The questions a release is asked, as plain values: one family of query types shared by the
mechanisms (`Mechanism.ask`), the analyst, which sends them to the servers, and each server, which
checks and answers them (`dpcdf.service.server.answers`); the server's Pydantic models convert to and
from them. No HTTP here: `to_dict` is the query as JSON-ready data (the wire's field names), and
`from_dict` reads it back.

Adding a query type: a frozen dataclass here with its `kind` (and `QUERY_TYPES`), its Pydantic model,
its branch in the server's single dispatch, and the mechanism that asks it."""
from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Callable, ClassVar, Iterable, Union

import numpy as np

from ..errors import ParameterError


def _int(value: object, what: str) -> int:
    """A Python int (numpy integers accepted; bools, floats and strings refused)."""
    if isinstance(value, (bool, np.bool_)):
        raise ParameterError(f"{what}: expected an integer, got a boolean")
    try:
        return operator.index(value)  # type: ignore[arg-type]  # any object: its TypeError is the answer
    except TypeError:
        raise ParameterError(f"{what}: expected an integer, got {value!r:.40}") from None


def _ints(values: object, what: str) -> tuple[int, ...]:
    """A tuple of Python ints, from a sequence or a 1-d integer array."""
    if isinstance(values, np.ndarray) and values.ndim == 1 and np.issubdtype(values.dtype, np.integer):
        return tuple(values.tolist())
    try:
        items = list(values)  # type: ignore[call-overload]  # any object: its TypeError is the answer
    except TypeError:
        raise ParameterError(f"{what}: expected a sequence of integers, got {values!r:.40}") from None
    return tuple(_int(v, what) for v in items)


@dataclass(frozen=True)
class PrefixQuery:
    """Noisy counts of the values with grid index <= i, for each index i."""
    indices: tuple[int, ...]
    kind: ClassVar[str] = "prefix"

    if TYPE_CHECKING:  # the generated __init__ takes any integers (`__post_init__` makes them a tuple)
        def __init__(self, indices: Iterable[int] | np.ndarray) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", _ints(self.indices, "prefix indices"))


@dataclass(frozen=True)
class NodesQuery:
    """Noisy counts of every data-holding node of one released tree level; `whole` (an adaptive task
    of plan versions 6 to 8): of its whole tree, the route taken on large data (`adaptive_route`), not of its
    round-two tree."""
    level: int
    whole: bool | None = None
    kind: ClassVar[str] = "nodes"

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", _int(self.level, "a tree level"))
        if self.whole is not None and not isinstance(self.whole, bool):
            raise ParameterError(f"whole is true or false, got {self.whole!r:.40}")
        if self.whole is False:
            object.__setattr__(self, "whole", None)  # the round-two tree, as a query without the field


@dataclass(frozen=True)
class CoordinatesQuery:
    """A factorization's noisy coordinates R x + z at every coordinate (then, under substitution, n)."""
    kind: ClassVar[str] = "coordinates"


@dataclass(frozen=True)
class BinsQuery:
    """An adaptive release's noisy bin counts: round 0 (plan versions 6 to 8) the counts that choose
    the route (`adaptive_route`: the whole grid's, from version 7 under add/remove and 8 under both the fine bins'; no
    `ends`), round 1 its fixed bins (no `ends`; version 9: a tree level's nodes), round 2 the bins ending at `ends`, then the totals of
    those split `groups` (`RoundTwo.groups`; None: no groups)."""
    round: int
    ends: tuple[int, ...] | None = None
    groups: tuple[int, ...] | None = None
    kind: ClassVar[str] = "bins"

    if TYPE_CHECKING:  # the generated __init__ takes any integers (`__post_init__` makes them tuples)
        def __init__(self, round: int, ends: Iterable[int] | np.ndarray | None = None,
                     groups: Iterable[int] | np.ndarray | None = None) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "round", _int(self.round, "a round"))
        if self.ends is not None:
            object.__setattr__(self, "ends", _ints(self.ends, "bin ends"))
        if self.groups is not None:
            object.__setattr__(self, "groups", _ints(self.groups, "group ends"))


@dataclass(frozen=True)
class GroupsQuery:
    """A calibration release's noisy group sums between these grid indices (once per task)."""
    edges: tuple[int, ...]
    kind: ClassVar[str] = "groups"

    if TYPE_CHECKING:  # the generated __init__ takes any integers (`__post_init__` makes them a tuple)
        def __init__(self, edges: Iterable[int] | np.ndarray) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "edges", _ints(self.edges, "group edges"))


Query = Union[PrefixQuery, NodesQuery, CoordinatesQuery, BinsQuery, GroupsQuery]
QUERY_TYPES: tuple[type[Query], ...] = (PrefixQuery, NodesQuery, CoordinatesQuery, BinsQuery, GroupsQuery)
BY_KIND: dict[str, type[Query]] = {cls.kind: cls for cls in QUERY_TYPES}

Answer = Callable[[Query], np.ndarray]
"""Whoever answers queries (the two servers through the analyst, or exact counts centrally):
a query -> its noisy values (a trailing axis per payload element, if any)."""


def to_dict(q: Query) -> dict:
    """The query as JSON-ready data: {"kind": ..., then its fields}, tuples as lists, absent (None)
    fields left out."""
    out: dict = {"kind": q.kind}
    for f in fields(q):
        value = getattr(q, f.name)
        if value is not None:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def from_dict(data: dict) -> Query:
    """The query `to_dict` gave (ParameterError for an unknown kind or fields)."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in BY_KIND:
        raise ParameterError(f"unknown query kind {kind!r:.40}")
    try:
        return BY_KIND[kind](**{k: v for k, v in data.items() if k != "kind"})
    except TypeError as exc:
        raise ParameterError(f"not a {kind} query: {exc}") from None
