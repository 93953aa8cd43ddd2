"""Adaptive tasks over the two servers (issue 14): round one's fixed bins, then one round-two design
(a histogram on the analyst's bins, or the tree's nodes) that each server fixes the first time it is
asked and never answers differently; each server adds its own PRF noise. Real server processes on
loopback, real HPKE, real SQLite; the CLI as a user runs it."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from dpcdf.analyst import Analyst
from dpcdf.release.adaptive import ROUND_ONE_BINS, AdaptiveMechanism
from dpcdf.release.ecdf import finish_release, prefix_counts
from dpcdf.release.noise import prf_noise
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import ServerError
from dpcdf.service.task import TaskConfig
from helpers import dpcdf_cli, urls

GRID8 = {"kind": "uniform", "lo": 0.0, "hi": 100.0, "bits": 8}  # the adaptive mechanism needs >= 256 points


def _skewed(n: int, seed: int) -> np.ndarray:
    return np.minimum(np.random.default_rng(seed).exponential(8, n), 99.9)  # the simulated data only


def _uniform(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 100, n)  # the simulated data only


def _seed(data_dir: Path, task_id: str) -> bytes:
    db = sqlite3.connect(str(data_dir / "server.sqlite"))
    (seed,) = db.execute("SELECT noise_seed FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    db.close()
    return bytes(seed)


def _both_noises(pair, config: TaskConfig):
    """The analyst's view of the noise: the sum of both servers' PRF noise for any ids and scale."""
    keys = [Aggregator(config.dcf(), config.make_mechanism(), _seed(d, config.task_id), config.task_id).keys[0]
            for _, _, d in pair]
    return lambda ids, scale: sum(prf_noise(k, ids, scale) for k in keys)


def _adaptive(pair, relation: str = "substitution", epsilon: float = 1.0, verify: bool | None = None):
    return create_task(urls(pair), GRID8, epsilon, "adaptive", relation, min_batch=0, verify=verify)


@pytest.mark.parametrize("data, relation, verify, design", [
    (_skewed, "substitution", None, "bins"), (_uniform, "substitution", False, "bins"),
    (_skewed, "add-remove", False, "bins")])
def test_the_two_server_release_is_the_central_one_with_both_servers_noise(servers, data, relation, verify, design):
    """The release the analyst gets equals, value for value, the central adaptive release of the same
    data whose noise is the sum of the two servers' PRF noises (so twice the variance), planned knowing
    that (copies = 2)."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = _adaptive(pair, relation, verify=verify)
    vals = data(400, 3)
    assert submit(config, vals, batch=100)["complete"] == 400
    rel = Analyst(config, token).release()
    mech, grid = config.make_mechanism(), config.make_grid()
    assert isinstance(mech, AdaptiveMechanism) and rel.mechanism.name == "adaptive"
    prefix = prefix_counts(vals, grid)
    central = mech.noisy(prefix, _both_noises(pair, config), copies=2)
    assert central.plan.design == design
    want = finish_release(grid, mech, central, 400 if relation == "substitution" else 0, copies=2)
    np.testing.assert_allclose(rel.counts, want.counts, atol=1e-6)
    assert rel.total == pytest.approx(want.total) and relation in rel.statement


def test_round_two_is_answered_once_with_one_design(servers):
    """The servers refuse a round two outside the plan: after the first round-two bins, other bins and
    the tree's nodes are refused (403, the budget is spent) by both; the same bins again give the same
    answer (PRF noise: nothing spent twice); round one can be asked again, the same."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = _adaptive(pair)
    submit(config, _skewed(200, 4))
    analyst = Analyst(config, token)
    one, n = analyst._ask({"kind": "bins", "round": 1})
    assert one.size == ROUND_ONE_BINS and n == 200 and np.all(one == analyst._ask({"kind": "bins", "round": 1})[0])
    ends = [9, 40, 255]
    two, _ = analyst._ask({"kind": "bins", "round": 2, "ends": ends})
    assert two.size == 3 and np.array_equal(two, analyst._ask({"kind": "bins", "round": 2, "ends": ends})[0])
    for other in ({"kind": "bins", "round": 2, "ends": [10, 40, 255]}, {"kind": "bins", "round": 2, "ends": [255]},
                  {"kind": "nodes", "level": 0}):
        with pytest.raises(ServerError, match="403.*already released"):
            analyst._ask(other)
    with pytest.raises(ServerError, match="403"):  # the analyst's own plan is other bins: refused, not answered twice
        analyst.release()


def test_a_first_node_query_fixes_the_tree_and_the_release_follows_it(servers):
    """Round two by the tree's nodes first: bins are refused after it; the analyst's release is
    answered when its plan (from round one) is the tree, as it usually is on spiky data on a finer
    grid at eps 1, and refused when it plans bins."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = create_task(urls(pair), {"kind": "uniform", "lo": 0.0, "hi": 100.0, "bits": 11}, 1.0, "adaptive",
                                "substitution", min_batch=0, verify=False)
    rng = np.random.default_rng(5)  # the simulated data only: five narrow spikes
    vals = np.clip(rng.normal(np.array([7.0, 7.5, 44.0, 63.0, 95.0])[rng.integers(0, 5, 3000)], 0.1), 0, 100)
    submit(config, vals, batch=1000)
    analyst = Analyst(config, token)
    level0, _ = analyst._ask({"kind": "nodes", "level": 0})
    assert level0.size == 2048
    with pytest.raises(ServerError, match="403.*already released"):
        analyst._ask({"kind": "bins", "round": 2, "ends": [2047]})
    one, n = analyst._ask({"kind": "bins", "round": 1})
    if config.make_mechanism().plan(one, n, copies=2).design == "tree":  # the usual plan on spikes (random)
        rel = analyst.release()
        assert rel.mechanism.name == "adaptive" and rel.counts[-1] == pytest.approx(3000)
    else:  # a release planning bins is refused: the tree is fixed
        with pytest.raises(ServerError, match="403.*already released"):
            analyst.release()


@pytest.mark.parametrize("body, status", [
    ({"kind": "prefix", "indices": [3]}, 400), ({"kind": "coordinates"}, 400),
    ({"kind": "bins", "round": 1, "ends": [255]}, 400), ({"kind": "bins", "round": 2}, 400),
    ({"kind": "bins", "round": 2, "ends": [3, 2, 255]}, 400), ({"kind": "bins", "round": 2, "ends": [3, 200]}, 400),
    ({"kind": "bins", "round": 2, "ends": [-1, 255]}, 400), ({"kind": "bins", "round": 3}, 400),
    ({"kind": "nodes", "level": 99}, 400)])
def test_an_adaptive_task_refuses_what_it_does_not_answer(servers, body, status):
    procs, _ = servers
    config, token = _adaptive(procs["exact"])
    submit(config, _uniform(50, 6))
    analyst = Analyst(config, token)
    with pytest.raises(ServerError, match=str(status)):
        analyst._ask(body)
    # nothing was fixed by a refused query: a valid round two is still answered
    assert analyst._ask({"kind": "bins", "round": 2, "ends": [127, 255]})[0].size == 2


def test_other_tasks_refuse_bins(servers):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID8, 1.0, "tree", "substitution", min_batch=0)
    submit(config, _uniform(30, 7))
    with pytest.raises(ServerError, match="400.*adaptive"):
        Analyst(config, token)._ask({"kind": "bins", "round": 1})


def test_adaptive_configs_are_count_tasks_on_grids_it_fits():
    from dpcdf import ParameterError
    base = dict(grid=GRID8, epsilon=1.0, mechanism="adaptive", relation="substitution", min_batch=0,
                servers=("http://a", "http://b"), hpke_keys=("00", "01"), token_hash="0" * 64)
    assert TaskConfig(**base).make_mechanism().name == "adaptive"
    for bad in ({"payload": "label"}, {"grid": {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 7}},
                {"privacy": "zcdp", "epsilon": None, "rho": 0.5}):
        with pytest.raises(ParameterError):
            TaskConfig(**{**base, **bad})
    assert TaskConfig.default_mechanism(GRID8, "substitution") == "adaptive"
    assert TaskConfig.default_mechanism(GRID8, "add-remove") == "tree"
    assert TaskConfig.default_mechanism({"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 6}, "substitution") == "tree"
    assert json.loads(TaskConfig(**base).to_json())["mechanism"] == "adaptive"


def test_the_cli_makes_an_adaptive_task_by_default_and_answers_it_again_after_an_error(servers, tmp_path):
    """The user's path: `dpcdf task` (no --mechanism: adaptive on a 2^8 grid), `dpcdf submit`,
    `dpcdf query` twice (the second answered from the same fixed rounds), `--bisect` refused clearly."""
    procs, _ = servers
    dpcdf = dpcdf_cli
    task = tmp_path / "task.json"
    made = dpcdf("task", "--servers", *urls(procs["noisy"]), "--grid", "uniform:0:100:8", "--epsilon", "1",
                 "--min-batch", "0", "--out", str(task))
    assert made.returncode == 0, made.stderr
    assert TaskConfig.from_json(task.read_text()).mechanism == "adaptive"
    sent = dpcdf("submit", "--task", str(task), "--values", *[repr(float(v)) for v in _skewed(120, 8)])
    assert sent.returncode == 0, sent.stderr
    first = dpcdf("query", "--task", str(task), "--quantiles", "0.5")
    assert first.returncode == 0, first.stderr
    assert "adaptive" in first.stdout and "q(0.5) = " in first.stdout
    again = dpcdf("query", "--task", str(task), "--quantiles", "0.5")
    assert again.returncode == 0 and again.stdout == first.stdout
    bisect = dpcdf("query", "--task", str(task), "--bisect")
    assert bisect.returncode == 2 and "adaptive mechanism" in bisect.stderr and "without --bisect" in bisect.stderr  # names the mechanism and what to do
