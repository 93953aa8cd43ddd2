"""One family of query types (`dpcdf.release.queries`): plain values that the mechanisms ask
(`Mechanism.ask`), the analyst sends and the server's Pydantic models read back, with the same JSON
field names everywhere."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dpcdf import ParameterError, PathMechanism, TreeMechanism
from dpcdf.release import queries as Q
from dpcdf.release.adaptive import AdaptiveMechanism
from dpcdf.release.factorization import sqrt_factorization
from dpcdf.service.server import models

EXAMPLES = [Q.PrefixQuery([0, 5, 7]), Q.NodesQuery(2), Q.CoordinatesQuery(), Q.BinsQuery(1),
            Q.BinsQuery(2, (3, 9, 255)), Q.GroupsQuery((1, 1, 4))]
WIRE = [{"kind": "prefix", "indices": [0, 5, 7]}, {"kind": "nodes", "level": 2}, {"kind": "coordinates"},
        {"kind": "bins", "round": 1}, {"kind": "bins", "round": 2, "ends": [3, 9, 255]},
        {"kind": "groups", "edges": [1, 1, 4]}]


def test_every_type_has_an_example_and_a_model():
    assert {type(q) for q in EXAMPLES} == set(Q.QUERY_TYPES) == set(models.MODELS)
    assert {cls.kind for cls in Q.QUERY_TYPES} == set(Q.BY_KIND) and len(Q.BY_KIND) == len(Q.QUERY_TYPES)
    for cls, model in models.MODELS.items():
        assert model.model_fields["kind"].annotation.__args__ == (cls.kind,)  # Literal[kind]
        assert set(model.model_fields) == {"kind"} | {f for f in cls.__dataclass_fields__ if f != "kind"}


@pytest.mark.parametrize("q,wire", list(zip(EXAMPLES, WIRE)), ids=[w["kind"] for w in WIRE[:3]] + ["bins1", "bins2", "groups"])
def test_each_query_round_trips_through_its_json_and_its_model(q, wire):
    assert Q.to_dict(q) == wire and list(Q.to_dict(q)) == list(wire)  # the same keys, in the same order
    assert json.dumps(Q.to_dict(q)) == json.dumps(wire)  # the bytes the analyst sends
    assert Q.from_dict(wire) == q
    model = models.MODELS[type(q)].from_query(q)
    assert model.to_query() == q
    assert model.model_dump(exclude_none=True) == wire
    assert models.MODELS[type(q)].model_validate_json(json.dumps(wire)).to_query() == q


def test_values_are_normalised_and_frozen():
    q = Q.PrefixQuery(np.array([3, 1], np.int64))
    assert q.indices == (3, 1) and all(type(i) is int for i in q.indices)
    assert Q.PrefixQuery([np.int32(3), 1]) == Q.PrefixQuery((3, 1)) and hash(q) == hash(Q.PrefixQuery((3, 1)))
    assert Q.NodesQuery(np.int64(2)).level == 2 and type(Q.NodesQuery(np.int64(2)).level) is int
    with pytest.raises(AttributeError):
        q.indices = (0,)


@pytest.mark.parametrize("make", [lambda: Q.PrefixQuery([1.5]), lambda: Q.PrefixQuery([True]), lambda: Q.PrefixQuery(3),
                                  lambda: Q.NodesQuery("1"), lambda: Q.NodesQuery(False), lambda: Q.BinsQuery(2, ["a"]),
                                  lambda: Q.GroupsQuery([1.0]), lambda: Q.from_dict({"kind": "nope"}),
                                  lambda: Q.from_dict({"kind": "nodes", "depth": 1}), lambda: Q.from_dict([1])])
def test_a_malformed_query_is_a_parameter_error(make):
    with pytest.raises(ParameterError):
        make()


def _recording(answer):
    asked = []

    def record(q):
        asked.append(q)
        return answer(q)

    return asked, record


@pytest.mark.parametrize("mech", [PathMechanism(64, 1.0), TreeMechanism(64, 1.0), TreeMechanism(64, 1.0, "add-remove")],
                         ids=["path", "tree", "tree-add-remove"])
def test_ask_is_gather_in_typed_queries(mech):
    """`ask` gives the release `gather` gives from the same answers, and asks in plain query types only."""
    prefix = np.cumsum(np.random.default_rng(1).integers(0, 5, 64))
    noise = lambda ids, scale: np.zeros(np.asarray(ids).size, np.int64)  # noqa: E731
    central = mech.noisy(prefix, noise)

    def answer(q):
        if isinstance(q, Q.PrefixQuery):
            return prefix[list(q.indices)].astype(np.float64)
        return mech.central_nodes(prefix, noise)(q.level)

    asked, record = _recording(answer)
    got = mech.ask(record)
    assert asked and {type(q) for q in asked} <= {Q.PrefixQuery, Q.NodesQuery}
    for a, b in zip(got if isinstance(got, list) else [got], central if isinstance(central, list) else [central]):
        np.testing.assert_array_equal(a, b)
    if mech.name == "path":
        assert asked == [Q.PrefixQuery(np.arange(64))]
    else:
        assert asked == [Q.NodesQuery(level) for level in mech.released_levels()]


def test_an_adaptive_release_asks_round_one_without_ends_then_round_two_with_them():
    mech = AdaptiveMechanism(256, 1.0, plan_version=5)
    asked, record = _recording(lambda q: np.full(mech.bins_one if q.round == 1 else len(q.ends), 10.0))
    mech.ask(record, n=lambda: 320, copies=2)
    assert asked[0] == Q.BinsQuery(1) and Q.to_dict(asked[0]) == {"kind": "bins", "round": 1}
    assert all(isinstance(q, Q.BinsQuery) and q.round == 2 and q.ends[-1] == 255 for q in asked[1:]) and len(asked) == 2


@pytest.mark.parametrize("n, route", [(320, "rounds"), (50_000, "whole")])
def test_plan_version_6_asks_round_zero_then_one_route(n, route):
    """Version 6 first asks round zero (the count of the grid, no ends: n itself under substitution),
    then either round one and round two, or the whole tree's nodes (every released level, `whole`)."""
    mech = AdaptiveMechanism(256, 1.0, plan_version=7)  # (version 8's round zero: the fine bins' counts, noisy)

    def answer(q):
        if isinstance(q, Q.NodesQuery):
            return np.full(mech.whole.level_nodes(q.level), 1.0)
        return np.full(1 if q.round == 0 else mech.bins_one if q.round == 1 else len(q.ends), float(n) if q.round == 0 else 10.0)
    asked, record = _recording(answer)
    mech.ask(record, n=lambda: n, copies=2)
    assert asked[0] == Q.BinsQuery(0) and Q.to_dict(asked[0]) == {"kind": "bins", "round": 0}
    if route == "whole":
        assert asked[1:] == [Q.NodesQuery(level, True) for level in mech.whole.released_levels()]
        assert Q.to_dict(asked[1]) == {"kind": "nodes", "level": 0, "whole": True}
    else:
        assert asked[1] == Q.BinsQuery(1) and all(not isinstance(q, Q.NodesQuery) or q.whole is None for q in asked)


def test_a_factorization_asks_its_coordinates_once():
    mech = sqrt_factorization(64, 1.0, "substitution")
    asked, record = _recording(lambda q: np.zeros(65))
    assert mech.ask(record, n=64).shape == (65,)
    assert asked == [Q.CoordinatesQuery()]
