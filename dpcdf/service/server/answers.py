"""How a server takes each query type (`dpcdf.release.queries`), in one place per type: what the
model cannot check without the task (`check`), the release design a query fixes for good (`designs`),
and its shares (`shares`). One handler per plain query type, found by the query's type (`handler`):
adding a query type adds its handler here, and nothing else on the server.

Free of HTTP: a query the task does not answer is a `QueryRefused` (HTTP 400, `errors.STATUS`)."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, TypeVar

import numpy as np

from ...errors import ParameterError
from ...release.adaptive import RoundTwo
from ...release.adaptive_route import takes_routes
from ...release.queries import QUERY_TYPES, BinsQuery, CoordinatesQuery, GroupsQuery, NodesQuery, PrefixQuery, Query

if TYPE_CHECKING:
    from .aggregate import Aggregator, Histogram
    from ..task import TaskConfig

KINDS = ("kind must be 'prefix', 'nodes', (factorization tasks) 'coordinates', (adaptive tasks) 'bins' or "
         "(calibration tasks) 'groups'")
ADAPTIVE_ONLY = "an adaptive task answers 'bins' and its round-two tree's 'nodes' only, and only it answers 'bins'"
FACTORIZATION_ONLY = "a factorization task answers 'coordinates' queries only, and only it does"
SPENT_GROUPS = "this task's groups are already released with other boundaries: the budget is spent"
SPENT_ROUTE = ("this task's release already took its other route (the whole tree, or round one's bins and round two): "
               "the budget is spent")
SPENT_ROUND_TWO = ("this task's round two is already released with another design (other bins, or its tree): "
                   "the budget is spent")


class QueryRefused(ParameterError):
    """A query this task does not answer (its grid, mechanism or payload rule it out): HTTP 400."""


Q = TypeVar("Q", PrefixQuery, NodesQuery, CoordinatesQuery, BinsQuery, GroupsQuery)  # a handler's query type


class Handler(Generic[Q]):
    """The server's side of one query type. `check` runs before anything is read, `designs` lists the
    (kind, design, refusal) the query fixes at its first answer (`TaskState.open_for_query`), `shares`
    is this server's answer from the task's key shares or histogram share (`source`)."""

    answered_by: ClassVar[frozenset[str]] = frozenset({"prefix"})  # the task families that answer it (`family`)
    every_element: ClassVar[bool] = False  # False: a calibration task answers its probabilities' ECDF only

    def check(self, q: Q, config: "TaskConfig", agg: "Aggregator") -> None:
        """QueryRefused unless the task answers `q`."""

    def designs(self, q: Q, config: "TaskConfig") -> list[tuple[str, str, str]]:
        """The release designs `q` fixes for good (none for most types)."""
        return []

    def shares(self, q: Q, config: "TaskConfig", agg: "Aggregator", source: "list | Histogram") -> np.ndarray:
        """This server's shares of the answer (uint64; a trailing axis per payload element)."""
        raise NotImplementedError


_HANDLERS: dict[type, Handler[Any]] = {}


def _handles(query_type: type) -> Callable[[type[Handler[Any]]], type[Handler[Any]]]:
    """Registers a Handler subclass (one instance) as the handler of `query_type`."""
    def register(cls: type[Handler[Any]]) -> type[Handler[Any]]:
        _HANDLERS[query_type] = cls()
        return cls
    return register


def handler(q: Query) -> Handler[Any]:
    """The handler of the query's type (every type of `QUERY_TYPES` has one)."""
    try:
        return _HANDLERS[type(q)]
    except KeyError:
        raise QueryRefused(KINDS) from None


def _in_grid(values: tuple[int, ...], end: int) -> bool:
    return all(0 <= v < end for v in values)


@_handles(PrefixQuery)
class _Prefix(Handler[PrefixQuery]):
    def check(self, q: PrefixQuery, config, agg) -> None:
        size = agg.mechanism.size
        if not _in_grid(q.indices, size):
            raise QueryRefused(f"indices must be a non-empty list of grid indices in [0, {size})")

    def shares(self, q: PrefixQuery, config, agg, source) -> np.ndarray:
        return agg.prefix_shares(source, np.array(q.indices, np.int64))


@_handles(NodesQuery)
class _Nodes(Handler[NodesQuery]):
    answered_by = frozenset({"prefix", "adaptive"})  # a tree's, or an adaptive task's round-two (or whole) tree's

    def check(self, q: NodesQuery, config, agg) -> None:
        if q.whole and getattr(agg.mechanism, "whole", None) is None:
            raise QueryRefused("only an adaptive task of plan versions 6 to 8 (with fine bins) has a whole tree")
        tree = agg.mechanism.whole if q.whole else agg.mechanism
        if config.mechanism not in ("tree", "adaptive") or q.level not in tree.released_levels():
            raise QueryRefused("node queries need the tree mechanism and a released level")

    def designs(self, q: NodesQuery, config) -> list[tuple[str, str, str]]:
        if config.mechanism != "adaptive":
            return []
        if q.whole:  # plan version 6 and later: the whole tree, never round one's bins or round two as well
            return [("route", json.dumps("whole"), SPENT_ROUTE)]
        return _rounds(config) + [("round-two", json.dumps("tree"), SPENT_ROUND_TWO)]

    def shares(self, q: NodesQuery, config, agg, source) -> np.ndarray:
        return agg.node_shares(source, q.level, bool(q.whole))


@_handles(CoordinatesQuery)
class _Coordinates(Handler[CoordinatesQuery]):
    answered_by = frozenset({"factorization"})

    def shares(self, q: CoordinatesQuery, config, agg, source) -> np.ndarray:
        return agg.coordinate_shares(source)


@_handles(BinsQuery)
class _Bins(Handler[BinsQuery]):
    answered_by = frozenset({"adaptive"})

    def check(self, q: BinsQuery, config, agg) -> None:
        if (q.round == 2) != (q.ends is not None) or (q.groups is not None and q.round != 2):
            raise QueryRefused("round 1's bins (and round 0's count) are the task's (no ends); round 2 names its bins' ends (and groups)")
        if q.round == 0 and not getattr(agg.mechanism, "routed", False):
            raise QueryRefused("round 0 (the counts that choose the route) is an adaptive task's of plan versions 6 to 8 "
                               "(with fine bins)")
        if q.ends is not None:
            try:
                agg.mechanism.check_plan(RoundTwo("bins", q.ends, groups=q.groups or ()))
            except ParameterError as exc:
                raise QueryRefused(str(exc)) from None

    def designs(self, q: BinsQuery, config) -> list[tuple[str, str, str]]:
        if q.round != 2:
            return _rounds(config) if q.round == 1 else []  # round 0 chooses the route: either may follow
        ends = list(q.ends or ())  # (round 2 names them: `check`)
        design = {"ends": ends, "groups": list(q.groups)} if q.groups else ends  # a plan without groups: as before
        return _rounds(config) + [("round-two", json.dumps(design), SPENT_ROUND_TWO)]

    def shares(self, q: BinsQuery, config, agg, source) -> np.ndarray:
        return agg.bin_shares(source, q.round, None if q.ends is None else np.array(q.ends, np.int64), q.groups or ())


@_handles(GroupsQuery)
class _Groups(Handler[GroupsQuery]):
    every_element = True  # the group sums of every payload element

    def check(self, q: GroupsQuery, config, agg) -> None:
        if not config.payload.scored:
            raise QueryRefused(KINDS)
        size = agg.mechanism.size
        if not _in_grid(q.edges, size - 1):
            raise QueryRefused(f"edges must be non-decreasing grid indices in [0, {size - 1})")

    def designs(self, q: GroupsQuery, config) -> list[tuple[str, str, str]]:
        return [("groups", json.dumps(list(q.edges)), SPENT_GROUPS)]

    def shares(self, q: GroupsQuery, config, agg, source) -> np.ndarray:
        return agg.group_shares(source, np.array(q.edges, np.int64), config.group_scales())  # DLap, or N_Z under zCDP


assert set(_HANDLERS) == set(QUERY_TYPES), "every query type has its handler"


def family(config: "TaskConfig", agg: "Aggregator") -> str:
    """Which queries a task answers, by its mechanism: "adaptive" (bins, and its round-two tree's
    nodes), "factorization" (coordinates only: its noise is on R x, not on prefixes or nodes), or
    "prefix" (path and tree: prefixes, nodes, groups)."""
    if config.mechanism == "adaptive":
        return "adaptive"
    return "prefix" if agg.mechanism.answers_prefixes else "factorization"


def check(q: Query, config: "TaskConfig", agg: "Aggregator") -> None:
    """What the model cannot check without the task (QueryRefused): the task's family answers the
    query's type (only an adaptive task answers bins; a factorization task coordinates only, and only
    it does), then the type's own rule (indices on the grid, a released level, groups on calibration
    tasks only, round two's bins a partition of the grid)."""
    h, kind = handler(q), family(config, agg)
    if kind not in h.answered_by:
        bins = kind == "adaptive" or h.answered_by == {"adaptive"}  # the rule broken: adaptive's, or factorization's
        raise QueryRefused(ADAPTIVE_ONLY if bins else FACTORIZATION_ONLY)
    h.check(q, config, agg)


def _rounds(config: "TaskConfig") -> list[tuple[str, str, str]]:
    """An adaptive task of plan versions 6 to 8 answers round one and round two (or the whole tree) on one
    route only: a query of the rounds fixes that route (`dpcdf.release.adaptive_route`)."""
    routed = config.mechanism == "adaptive" and takes_routes(config.adaptive_plan, config.fine_bins)
    return [("route", json.dumps("rounds"), SPENT_ROUTE)] if routed else []


def designs(q: Query, config: "TaskConfig") -> list[tuple[str, str, str]]:
    """The (kind, design, refusal) this query fixes at its first answer: a calibration task's group
    boundaries, an adaptive task's round two (its bins, or its tree); another design after that would
    spend the budget again."""
    return handler(q).designs(q, config)


def shares(q: Query, config: "TaskConfig", agg: "Aggregator", source: "list | Histogram") -> np.ndarray:
    """This server's shares of the answer to a checked query (a calibration task's queries other than
    its groups answer the ECDF of the probabilities only: its other elements go out as group sums)."""
    h = handler(q)
    out = h.shares(q, config, agg, source)
    return out if not config.payload.scored or h.every_element else out[:, 0]
