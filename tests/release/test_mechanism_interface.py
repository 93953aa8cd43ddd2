"""One interface for both mechanisms: callers (the central release, a server's aggregation, the
analyst) call `Mechanism` methods instead of asking which mechanism they hold; privacy statements
name the requested epsilon within the stated rounding; errors stay in the `dpcdf.errors` vocabulary."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from fss import field as F
import pytest

from dpcdf import DpcdfError, Grid, ParameterError, PathMechanism, TreeMechanism, release_ecdf
from dpcdf.release.ecdf import finish_release, prefix_counts
from dpcdf.release.mechanisms import Mechanism
from dpcdf.release.mechanisms.accounting import round_up as _round_up
from dpcdf.release.noise import EPSILON_ROUNDING, prf_key, prf_noise
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.task import TaskConfig

EPSILONS = (0.1, 0.5, 1.0, 7.77)
RELATIONS = ("substitution", "add-remove")
MECHANISMS = {"path": PathMechanism, "tree": TreeMechanism}
KEY = bytes(range(16))


def _noise(ids, scale):
    return prf_noise(KEY, ids, scale)


# --- privacy statements ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", MECHANISMS)
@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("size", [1000, 1 << 16])
def test_a_statement_names_the_requested_epsilon(kind, relation, epsilon, size):
    mech = MECHANISMS[kind](size, epsilon, relation)
    exact = mech.exact_epsilon(relation)
    assert isinstance(exact, Fraction) and exact <= Fraction(epsilon)  # never above what was asked
    assert Fraction(epsilon) - exact <= mech.rounding()  # and within the stated rounding below it
    assert mech.rounding() == mech.rounded_budgets() * EPSILON_ROUNDING + Fraction(epsilon) / 10**9
    assert mech.epsilon_for(relation) == float(exact) and mech.stated_epsilon() == epsilon
    text = mech.statement()
    assert text == mech.statement(relation)
    assert text.startswith(f"{epsilon:g}-DP under {relation} (epsilon = {epsilon:g}")
    assert f"{kind} mechanism" in text
    if exact != Fraction(epsilon):  # says how the exact sum relates to epsilon, and the rounding
        assert "up to rounding" in text and "2^-20" in text and f"{_round_up(exact, 10):.10g} <= epsilon" in text


def test_the_demos_tree_no_longer_states_0_999999():
    mech = TreeMechanism(1 << 16, 1.0)
    assert mech.exact_epsilon("substitution") < 1  # the level budgets really add up to a bit less
    assert mech.statement().startswith("1-DP under substitution (epsilon = 1 up to rounding")
    assert "0.999999-DP" not in mech.statement()


def test_a_budget_that_misses_epsilon_by_more_than_the_rounding_is_stated_exactly():
    mech = TreeMechanism(100, 1.0, branching=3, budgets=(0.2, 0.2, 0.2, 0.2, 0.1))  # 0.9 of 1
    exact = mech.exact_epsilon("substitution")
    assert Fraction(1) - exact > mech.rounding()
    assert mech.stated_epsilon() == _round_up(exact) >= float(exact)
    assert mech.statement().startswith(f"{_round_up(exact):g}-DP under substitution")
    paper = PathMechanism(1024, 1.0, calibration="paper")  # L + 1 shifts: stronger than asked
    assert paper.statement().startswith("0.909091-DP under substitution")  # 10/11, rounded up


def test_statements_under_the_other_relation():
    path = PathMechanism(1 << 16, 1.0, "substitution")  # 9 of 16 shifts explain an addition
    assert path.exact_epsilon("add-remove") == Fraction(9, 16)
    assert path.statement("add-remove").startswith("0.5625-DP under add-remove (epsilon = 0.5625:")
    back = PathMechanism(1000, 0.5, "add-remove")  # 10 / 12 under substitution
    assert back.stated_epsilon("substitution") == 0.833334 > 5 / 6
    tree = TreeMechanism(1000, 1.0, "substitution")
    assert tree.exact_epsilon("add-remove") is None and tree.epsilon_for("add-remove") == math.inf
    assert tree.stated_epsilon("add-remove") == math.inf
    assert tree.statement("add-remove").startswith("no DP guarantee under add-remove (")
    with pytest.raises(ParameterError):
        tree.statement("replace-one")


@pytest.mark.parametrize("value", [Fraction(1, 3), Fraction(5, 6), Fraction(3, 5), Fraction(999999, 1000000),
                                   Fraction(9999995, 10**7), Fraction(7, 10**9), 0.1, 2.0])
def test_round_up_never_states_less(value):
    shown = _round_up(value)
    assert Fraction(f"{shown:g}") >= Fraction(value) and shown <= float(value) * (1 + 2e-5)


# --- one interface -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", MECHANISMS)
def test_both_mechanisms_answer_the_same_calls(kind):
    mech = MECHANISMS[kind](100, 1.0)
    assert isinstance(mech, Mechanism) and mech.name == kind
    idx = np.array([0, 5, 50, 99])
    assert mech.prefix_noise(idx, _noise).shape == (4,)
    assert mech.node_noise(0, np.arange(3), _noise).shape == (3,)
    starts, ends = mech.node_bounds(1)
    assert starts.size == ends.size == mech.level_nodes(1) and ends[-1] == 99
    with pytest.raises(ParameterError):
        mech.prefix_noise([100], _noise)
    with pytest.raises(ParameterError):
        mech.prefix_noise([-1], _noise)


def test_path_prefix_noise_is_its_path_nodes_noise():
    mech = PathMechanism(100, 1.0)
    idx = np.array([0, 37, 99])
    want = sum(mech.node_noise(level, idx >> level, _noise) for level in range(mech.shape.height + 1))
    np.testing.assert_array_equal(mech.prefix_noise(idx, _noise), want)


@pytest.mark.parametrize("kind", MECHANISMS)
@pytest.mark.parametrize("relation", RELATIONS)
def test_the_central_release_is_noisy_then_estimate(kind, relation):
    grid = Grid.uniform(0, 1, 7)
    values = np.random.default_rng(3).random(500)
    mech = MECHANISMS[kind](grid.size, 1.0, relation)
    rel = release_ecdf(values, grid, 1.0, mechanism=mech, relation=relation, noise=_noise)
    prefix = prefix_counts(values, grid)
    raw, _ = mech.estimate(mech.noisy(prefix, _noise))
    np.testing.assert_array_equal(rel.raw, raw)
    # the raw release at every index is the exact count plus the prefix noise (the covering estimator's, for a tree)
    np.testing.assert_array_equal(rel.raw, prefix + mech.prefix_noise(np.arange(grid.size), _noise))
    assert rel.statement == mech.statement()


def test_smoothing_is_the_path_mechanisms():
    grid = Grid.uniform(0, 1, 6)
    values = np.random.default_rng(4).random(200)
    assert release_ecdf(values, grid, 1.0, mechanism="path").smooth().counts.shape == (grid.size,)
    with pytest.raises(ParameterError, match="path mechanism"):
        release_ecdf(values, grid, 1.0, mechanism="tree").smooth()


# --- the servers' and the analyst's side, in process ----------------------------------------------
def _config(mechanism: str, relation: str = "substitution", payload: str = "count", bits: int = 6) -> TaskConfig:
    return TaskConfig(grid={"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": bits}, epsilon=1.0, mechanism=mechanism,
                      relation=relation, min_batch=0, servers=("http://127.0.0.1:9", "http://127.0.0.1:10"),
                      hpke_keys=("00" * 32, "01" * 32), token_hash="00" * 32, payload=payload, task_id="in-process")


SEEDS = (b"\x01" * 32, b"\x02" * 32)


def _in_process(analyst: Analyst, values: np.ndarray, labels: np.ndarray | None = None) -> list[Aggregator]:
    """Two Aggregators over real key shares, answering the analyst's questions without HTTP."""
    config = analyst.config
    dcf = config.dcf()
    alphas = config.make_grid().index(values)
    betas = 1 if labels is None else np.stack([labels, 1 - labels], axis=1)
    keys = dcf.gen_batch(alphas, betas)
    aggs = [Aggregator(dcf, config.make_mechanism(), seed, config.task_id) for seed in SEEDS]

    def ask(question: dict):
        if question["kind"] == "prefix":
            shares = [agg.prefix_shares([k], np.array(question["indices"], np.int64)) for agg, k in zip(aggs, keys)]
        else:
            shares = [agg.node_shares([k], question["level"]) for agg, k in zip(aggs, keys)]
        if aggs[0].prime:  # a verified task's shares are in F_p
            return F.signed(F.add(shares[0], shares[1])), values.size
        return (shares[0] + shares[1]).view(np.int64), values.size

    analyst._closed, analyst._ask = True, ask
    return aggs


@pytest.mark.parametrize("mechanism", ["path", "tree"])
@pytest.mark.parametrize("relation", RELATIONS)
def test_the_analysts_release_is_the_central_one_with_both_servers_noise(mechanism, relation):
    analyst = Analyst(_config(mechanism, relation), "token")
    values = np.random.default_rng(5).random(300)
    aggs = _in_process(analyst, values)
    (got,) = analyst.releases()
    mech = analyst.mechanism
    both = lambda ids, scale: sum(prf_noise(a.keys[0], ids, scale) for a in aggs)  # noqa: E731
    want = finish_release(analyst.grid, mech, mech.noisy(prefix_counts(values, analyst.grid), both), values.size, copies=2)
    np.testing.assert_array_equal(got.raw, want.raw)
    np.testing.assert_array_equal(got.counts, want.counts)


def test_a_label_tasks_two_curves_each_carry_their_own_noise():
    analyst = Analyst(_config("tree", payload="label"), "token")
    rng = np.random.default_rng(6)
    values, labels = rng.random(200), rng.integers(0, 2, 200)
    aggs = _in_process(analyst, values, labels)
    positives, negatives = analyst.releases()
    mech, grid = analyst.mechanism, analyst.grid
    for e, (got, subset) in enumerate(((positives, values[labels == 1]), (negatives, values[labels == 0]))):
        both = lambda ids, scale: sum(prf_noise(a.keys[e], ids, scale) for a in aggs)  # noqa: E731
        want = mech.estimate(mech.noisy(prefix_counts(subset, grid), both), copies=2)[0]
        np.testing.assert_array_equal(got.raw, want)


def test_node_queries_outside_the_released_levels_are_parameter_errors():
    values = np.random.default_rng(7).random(50)
    path = Analyst(_config("path"), "token")
    (agg, _) = _in_process(path, values)
    with pytest.raises(ParameterError, match="path mechanism releases node counts of levels \\[\\]"):
        agg.node_shares([], 0)
    tree = Analyst(_config("tree", "add-remove", bits=5), "token")  # 32 points: is the tree full?
    (agg, _) = _in_process(tree, values)
    mech = agg.mechanism
    hidden = [lv for lv in range(mech.shape.height + 2) if lv not in mech.released_levels()]
    assert hidden  # at least the level above the root; the exact root too when the tree is padded
    for level in hidden + [True, "0", 1.0]:
        with pytest.raises(ParameterError):
            agg.node_shares([], level)
    assert agg.node_shares([], 0).shape == (mech.level_nodes(0),)


@pytest.mark.parametrize("levels", [[1.5], [-0.1], [float("nan")], [0.5, 2.0]])
def test_bad_quantile_levels_are_parameter_errors_centrally_and_at_the_analyst(levels):
    analyst = Analyst(_config("path"), "token")
    analyst._closed = True
    analyst._ask = lambda question: pytest.fail("bad levels must be refused before any question")  # noqa: E731
    with pytest.raises(ParameterError, match=r"quantile levels must lie in \[0, 1\]") as raised:
        analyst.quantile(levels)
    assert isinstance(raised.value, DpcdfError) and isinstance(raised.value, ValueError)
    rel = release_ecdf(np.random.default_rng(8).random(100), Grid.uniform(0, 1, 6), 1.0)
    with pytest.raises(ParameterError, match=r"quantile levels must lie in \[0, 1\]"):
        rel.quantile(levels)
    with pytest.raises(ParameterError):
        rel.quantile(levels, method="bisect")


def test_the_servers_noise_keys_are_per_element():
    analyst = Analyst(_config("path", payload="label"), "token")
    agg = Aggregator(analyst.config.dcf(), analyst.mechanism, SEEDS[0], "in-process")
    assert agg.keys == [prf_key(SEEDS[0], "in-process/path/0"), prf_key(SEEDS[0], "in-process/path/1")]
