"""Plan versions 6 to 8's route over the two servers (`dpcdf.release.adaptive_route`): on large data the
whole tree with every bit of epsilon, on small data the two rounds; under add/remove round zero's counts
choose (version 6: one count of the whole grid; 7: round one's fine bins, which also screen point masses). Each server answers one route per task: an analyst (or anyone holding its
token) who asks for both gets 403 from the second on, so the budget is round zero's plus one route's.
Real server processes on loopback, real HPKE, real SQLite."""
from __future__ import annotations

import numpy as np
import pytest

from dpcdf.analyst import Analyst
from dpcdf.release.adaptive import AdaptiveMechanism
from dpcdf.release.ecdf import finish_release, prefix_counts
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import ServerError
from helpers import urls
from test_adaptive_tasks import GRID8, _both_noises, _uniform

EPSILON = 4.0  # the whole tree from about 550 values (substitution) or 370 (add/remove) on 2^8; version 7 under add/remove
# takes round zero's 64 counts' sum 3 sds low (600 with two servers' noise), so its whole-tree case has 1,500 values


@pytest.mark.parametrize("relation, n, route, version", [("substitution", 700, "whole", 7), ("add-remove", 700, "whole", 6),
                                                         ("add-remove", 150, "rounds", 6), ("add-remove", 1500, "whole", 7),
                                                         ("add-remove", 150, "rounds", 7), ("substitution", 700, "whole", 8),
                                                         ("substitution", 150, "rounds", 8)])
def test_the_two_server_release_takes_the_route_of_the_central_one(servers, relation, n, route, version):
    """The analyst's release equals, value for value, the central release of the same data with both
    servers' PRF noise (copies = 2), on the same route: the whole tree past the route's n, the rounds
    below it; under add/remove (from version 8 under substitution too) round zero's counts (the same at
    every ask) are merged into the tree."""
    pair = servers[0]["noisy"]
    config, token = create_task(urls(pair), GRID8, EPSILON, "adaptive", relation, min_batch=0, verify=False, adaptive_plan=version)
    mech = config.make_mechanism()
    assert isinstance(mech, AdaptiveMechanism) and mech.plan_version == version and mech.routed
    vals = _uniform(n, 8)
    assert submit(config, vals, batch=200)["complete"] == n
    rel = Analyst(config, token).release()
    grid = config.make_grid()
    central = mech.noisy(prefix_counts(vals, grid), _both_noises(pair, config), copies=2)
    assert (central.plan.design == "whole") == (route == "whole")
    counted = relation == "add-remove" or version >= 8  # round zero's noisy counts
    assert (central.zero is not None) == counted
    want = finish_release(grid, mech, central, n if relation == "substitution" else 0, copies=2)
    assert (rel.released.zero is None) == (central.zero is None)
    if central.zero is not None:  # round zero's counts: the same PRF noise
        assert np.array_equal(rel.released.zero, central.zero)
        assert central.zero.size == (mech.fine_ends.size if version >= 7 else 1)
    np.testing.assert_allclose(rel.counts, want.counts, atol=1e-6)
    assert rel.released.plan.design == central.plan.design


def test_point_masses_below_the_routes_n_take_the_whole_tree_on_the_servers(servers):
    """Plan version 7 (review): 250 values on one point, below the route's n for two servers, under
    add/remove: round zero's fine counts screen them, and the analyst takes the whole tree, equal value
    for value to the central release with both servers' noise; the rounds are then refused (403)."""
    pair = servers[0]["noisy"]
    vals = np.full(250, 50.0)
    for _ in range(8):  # round zero's noise (each task's own PRF seeds) screens most such tasks, not all: find one
        config, token = create_task(urls(pair), GRID8, EPSILON, "adaptive", "add-remove", min_batch=0, verify=False,
                                    adaptive_plan=7)
        mech, grid = config.make_mechanism(), config.make_grid()
        assert submit(config, vals, batch=250)["complete"] == 250 and 250 < mech.whole_limit(2)
        central = mech.noisy(prefix_counts(vals, grid), _both_noises(pair, config), copies=2)
        if not mech.take_whole(mech.zero_n(central.zero, 2), 2) and mech.screened(central.zero, 2):
            break
    assert not mech.take_whole(mech.zero_n(central.zero, 2), 2) and mech.screened(central.zero, 2)
    analyst = Analyst(config, token)
    rel = analyst.release()
    assert rel.released.plan.design == central.plan.design == "whole" and np.array_equal(rel.released.zero, central.zero)
    np.testing.assert_allclose(rel.counts, finish_release(grid, mech, central, 0, copies=2).counts, atol=1e-6)
    with pytest.raises(ServerError, match="403.*other route"):
        analyst._ask({"kind": "bins", "round": 1})


def test_each_server_answers_one_route_only(servers):
    """A deviating analyst asks for the whole tree and for round one's bins (both orders, one per
    server): the second route is refused (403, the budget is spent), the first is answered again the
    same (PRF noise: nothing spent twice); round zero is answered on either route, the same each time."""
    pair = servers[0]["noisy"]
    config, token = create_task(urls(pair), GRID8, EPSILON, "adaptive", "add-remove", min_batch=0, verify=False,
                                adaptive_plan=8)
    submit(config, _uniform(120, 9), batch=120)
    analyst = Analyst(config, token)
    zero = analyst._ask({"kind": "bins", "round": 0})[0]
    assert zero.size == config.make_mechanism().fine_ends.size > 1  # plan version 7: the fine bins' counts
    nodes = analyst._ask({"kind": "nodes", "level": 0, "whole": True})[0]
    assert np.array_equal(nodes, analyst._ask({"kind": "nodes", "level": 0, "whole": True})[0])
    for rounds in ({"kind": "bins", "round": 1}, {"kind": "bins", "round": 2, "ends": [255]}, {"kind": "nodes", "level": 0}):
        with pytest.raises(ServerError, match="403.*other route"):
            analyst._ask(rounds)
    assert np.array_equal(zero, analyst._ask({"kind": "bins", "round": 0})[0])

    config, token = create_task(urls(pair), GRID8, EPSILON, "adaptive", "add-remove", min_batch=0, verify=False,
                                adaptive_plan=8)
    submit(config, _uniform(120, 10), batch=120)
    analyst = Analyst(config, token)
    analyst._ask({"kind": "bins", "round": 1})
    with pytest.raises(ServerError, match="403.*other route"):
        analyst._ask({"kind": "nodes", "level": 1, "whole": True})
    analyst._ask({"kind": "bins", "round": 0})  # round zero chooses the route: asked after, it is still answered


def test_route_queries_a_task_cannot_answer_are_400(servers):
    """Under substitution in plan version 7 round zero is n itself, exact (public: no budget is spent on
    it; version 8 counts the fine bins, noisy: `test_the_two_server_release_takes_the_route_of_the_central_one`); round zero
    and the whole tree on a tree task: 400 with a message, nothing fixed."""
    pair = servers[0]["noisy"]
    config, token = create_task(urls(pair), GRID8, EPSILON, "adaptive", "substitution", min_batch=0, verify=False,
                                adaptive_plan=7)
    submit(config, _uniform(60, 11), batch=60)
    analyst = Analyst(config, token)
    count, n = analyst._ask({"kind": "bins", "round": 0})
    assert count.tolist() == [60] and n == 60
    tree, tree_token = create_task(urls(pair), GRID8, EPSILON, "tree", "substitution", min_batch=0, verify=False)
    submit(tree, _uniform(60, 12), batch=60)
    with pytest.raises(ServerError, match="400.*whole tree"):
        Analyst(tree, tree_token)._ask({"kind": "nodes", "level": 0, "whole": True})
    with pytest.raises(ServerError, match="400"):
        Analyst(tree, tree_token)._ask({"kind": "bins", "round": 0})
    assert analyst._ask({"kind": "bins", "round": 1})[0].size > 0  # nothing was fixed by the refusals


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
@pytest.mark.parametrize("design", ["tree", "bins"])
def test_version_9s_round_one_is_the_trees_level_on_the_servers(servers, relation, design):
    """Plan version 9 (the default): round one is a level of the whole tree, answered from the same PRF noise
    as that level's nodes, so a release that ends in the tree is the tree's, and asking the level's nodes
    again gives round one's answers; the analyst's release equals the central one with both servers' noise,
    on either design (the tree: 3,000 values on 2^8 at eps 4, every time; a histogram: 1,000 spread values
    on 2^10 at eps 1, about 9 tasks in 10); round zero and the whole tree are refused (400: no route)."""
    pair = servers[0]["noisy"]
    grid_spec, epsilon, n = (GRID8, EPSILON, 3000) if design == "tree" else ({**GRID8, "bits": 10}, 1.0, 1000)
    for attempt in range(4):  # each task its own PRF seeds: a histogram is chosen in most, not all
        config, token = create_task(urls(pair), grid_spec, epsilon, "adaptive", relation, min_batch=0, verify=False)
        mech, grid = config.make_mechanism(), config.make_grid()
        assert isinstance(mech, AdaptiveMechanism) and mech.plan_version == 9 and not mech.routed
        vals = _uniform(n, 13 + attempt)
        assert submit(config, vals, batch=500)["complete"] == n
        central = mech.noisy(prefix_counts(vals, grid), _both_noises(pair, config), copies=2)
        if central.plan.design == design:
            break
    assert central.plan.design == design
    analyst = Analyst(config, token)
    rel = analyst.release()
    assert rel.released.plan.design == design
    np.testing.assert_array_equal(rel.released.round_one, central.round_one)
    want = finish_release(grid, mech, central, n if relation == "substitution" else 0, copies=2)
    np.testing.assert_allclose(rel.counts, want.counts, atol=1e-6)
    one = analyst._ask({"kind": "bins", "round": 1})[0]
    assert one.size == mech.fine_ends.size and np.array_equal(one, central.round_one[len(mech.round_one_ends):])
    if design == "tree":  # the level's nodes are round one's answers
        assert np.array_equal(analyst._ask({"kind": "nodes", "level": mech.one_level})[0], one)
    for refused in ({"kind": "bins", "round": 0}, {"kind": "nodes", "level": 0, "whole": True}):
        with pytest.raises(ServerError, match="400"):
            analyst._ask(refused)
