"""The released noise does not drift: tests/vectors/mechanism_noise_v2.json pins, under a fixed PRF
key, the prefix and node noise of both mechanisms and what a server adds to its shares, as the code
before the common `Mechanism` interface computed them (v2: the add/remove tree cases regenerated when
that plan gave the root a fixed share; the rest is v1, value for value) (the tree's prefix noise then came from a
per-index loop over `TreeShape.covering`; now it is batched). The batched tree prefix noise is also
checked against that loop on trees of many shapes."""
from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dpcdf.release.mechanisms import Mechanism, PathMechanism, TreeMechanism
from dpcdf.release.noise import prf_noise
from dpcdf.service.server.aggregate import Aggregator
from fss import DCF

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "mechanism_noise_v2.json").read_text())
KEY = bytes.fromhex(VECTORS["key"])
CASES = VECTORS["cases"]


def _noise(ids: np.ndarray, scale: Fraction) -> np.ndarray:
    return prf_noise(KEY, ids, scale)


def _mechanism(case) -> Mechanism:
    if case["mechanism"] == "path":
        return PathMechanism(case["size"], case["epsilon"], case["relation"])
    return TreeMechanism(case["size"], case["epsilon"], case["relation"], branching=case["branching"])


def _aggregator(mech: Mechanism) -> Aggregator:
    bits = max(1, int(np.ceil(np.log2(mech.size))))
    return Aggregator(DCF(bits, 64, 1, cmp="ge"), mech, bytes.fromhex(VECTORS["seed"]), VECTORS["task_id"])


def _id(case) -> str:
    return f"{case['mechanism']}-{case['size']}-{case['relation']}-b{case['branching']}"


def test_the_vectors_cover_both_mechanisms_relations_and_a_noised_root():
    kinds = {(c["mechanism"], c["relation"]) for c in CASES}
    assert kinds == {(m, r) for m in ("path", "tree") for r in ("substitution", "add-remove")}
    full = [c for c in CASES if c["mechanism"] == "tree" and c["relation"] == "add-remove"
            and c["size"] == c["branching"] ** _mechanism(c).shape.height]
    assert full and all(c["size"] - 1 in c["indices"] for c in full)  # the root alone covers the last prefix
    assert all(len(c["indices"]) >= 100 and any(v != 0 for v in c["prefix_noise"]) for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_prefix_noise_is_what_the_code_before_released(case):
    mech = _mechanism(case)
    got = mech.prefix_noise(np.array(case["indices"]), _noise)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.array(case["prefix_noise"], np.int64))
    # one index at a time gives the same (each node's noise is a function of its id)
    for k in (0, len(case["indices"]) // 2, len(case["indices"]) - 1):
        assert mech.prefix_noise([case["indices"][k]], _noise)[0] == case["prefix_noise"][k]


@pytest.mark.parametrize("case", [c for c in CASES if c["mechanism"] == "tree"], ids=_id)
def test_tree_node_noise_is_what_the_code_before_released(case):
    mech = _mechanism(case)
    assert sorted(case["node_noise"], key=int) == [str(lv) for lv in mech.released_levels()]
    for level, want in case["node_noise"].items():
        got = mech.node_noise(int(level), np.arange(len(want)), _noise)
        np.testing.assert_array_equal(got, np.array(want, np.int64))


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_a_servers_shares_carry_the_same_noise_as_before(case):
    mech = _mechanism(case)
    agg = _aggregator(mech)
    got = agg.prefix_shares([], np.array(case["indices"])).view(np.int64)
    np.testing.assert_array_equal(got, np.array(case["server_prefix_noise"], np.int64))
    assert sorted(case["server_node_noise"], key=int) == [str(lv) for lv in mech.released_levels()]
    for level, want in case["server_node_noise"].items():
        full = agg.node_shares([], int(level)).view(np.int64)
        assert full.size == mech.level_nodes(int(level))
        np.testing.assert_array_equal(full[:64], np.array(want["first"], np.int64))
        assert hashlib.sha256(full.astype("<i8").tobytes()).hexdigest() == want["sha256"]


def _loop_prefix_noise(mech: TreeMechanism, indices) -> np.ndarray:
    """The definition, one covering and one node at a time (the servers' code before issue 10)."""
    return np.array([sum(int(mech.node_noise(lv, np.array([j]), _noise)[0]) for lv, j in mech.shape.covering(int(i)))
                     for i in indices], np.int64)


@pytest.mark.parametrize("size,branching,relation", [
    (1, 2, "substitution"), (2, 2, "add-remove"), (7, 2, "substitution"), (8, 2, "add-remove"), (10, 3, "add-remove"),
    (27, 3, "add-remove"), (100, 7, "substitution"), (300, 300, "substitution"), (300, 300, "add-remove"),
    (256, 16, "add-remove"), (1000, 11, "substitution"), (4096, 64, "add-remove"),
])
def test_batched_tree_prefix_noise_equals_the_covering_loop(size, branching, relation):
    mech = TreeMechanism(size, 1.0, relation, branching=branching)
    every = np.arange(size)
    rng = np.random.default_rng(size * branching)
    # the batched path over every index; the slow reference loop at all of them on small trees, and on
    # large ones at both ends and 300 random indices (4,096 loop evaluations took ~15 s of the suite)
    sample = every if size <= 1000 else np.unique(np.concatenate([every[:100], every[-100:], rng.integers(0, size, 300)]))
    np.testing.assert_array_equal(mech.prefix_noise(every, _noise)[sample], _loop_prefix_noise(mech, sample))
    few = rng.integers(0, size, 5)  # few indices (the listed-runs branch), repeated ones, any order
    few = np.concatenate([few, few[:2]])
    np.testing.assert_array_equal(mech.prefix_noise(few, _noise), _loop_prefix_noise(mech, few))
    assert mech.prefix_noise(np.zeros(0, np.int64), _noise).shape == (0,)
