"""One policy table (dpcdf/release/policy.py) for what "auto" means and how a payload spends its
budget: the central release, the servers' task configs (`dpcdf task`'s default) and the applications
read it, so they cannot drift apart."""
import numpy as np
import pytest

from dpcdf import Grid, release_ecdf
from dpcdf.release.adaptive import MIN_ADAPTIVE_EPSILON, MIN_ADAPTIVE_GRID, AdaptiveMechanism, min_adaptive_epsilon
from dpcdf.release.factorization import MAX_FACTOR_GRID, SqrtFactorizationMechanism
from dpcdf.release.mechanisms import TreeMechanism
from dpcdf.release.policy import auto_mechanism, curve_budget
from dpcdf.release.zcdp import GaussianTreeMechanism
from dpcdf.service.task import MAX_TREE_SIZE, TaskConfig

KIND = {"adaptive": AdaptiveMechanism, "tree": TreeMechanism}


@pytest.mark.parametrize("bits", [3, 8, 12])
@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
@pytest.mark.parametrize("epsilon", [MIN_ADAPTIVE_EPSILON * 0.9, MIN_ADAPTIVE_EPSILON * 1.5, 4.9e-5, 5.01e-5, 1.0])
def test_the_central_release_and_a_task_pick_the_same_pure_mechanism(bits, relation, epsilon):
    """Review of version 7: under add/remove round zero's 2% must reach MIN_EPSILON too (epsilon 2e-5 to
    5e-5 raised instead of picking the tree); the central release and a task pick alike on both sides."""
    grid = Grid.uniform(0, 1, bits)
    choice = auto_mechanism(grid.size, relation, "pure", epsilon)
    assert choice == ("adaptive" if grid.size >= MIN_ADAPTIVE_GRID and epsilon >= min_adaptive_epsilon(relation) else "tree")
    assert min_adaptive_epsilon(relation) == MIN_ADAPTIVE_EPSILON  # version 9: no round zero, every share at least 5%
    assert min_adaptive_epsilon(relation, plan_version=8) == pytest.approx(5e-5)  # version 8: round zero under substitution too
    assert min_adaptive_epsilon(relation, plan_version=7) == (MIN_ADAPTIVE_EPSILON if relation == "substitution" else pytest.approx(5e-5))
    rel = release_ecdf(np.linspace(0, 1, 50), grid, epsilon, "auto", relation)
    assert isinstance(rel.mechanism, KIND[choice])
    spec = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": bits}
    assert TaskConfig.default_mechanism(spec, relation, "pure", epsilon) == choice


@pytest.mark.parametrize("size", [2, 64, MAX_FACTOR_GRID, MAX_FACTOR_GRID + 1])
def test_zcdp_auto_is_the_factorization_where_it_is_defined_and_the_gaussian_tree_past_it(size):
    grid = Grid.from_thresholds(np.arange(size, dtype=np.float64))
    choice = auto_mechanism(size, "substitution", "zcdp")
    assert choice == ("factorization" if size <= MAX_FACTOR_GRID else "tree")
    if size <= 64:  # the exact sensitivity of large factorizations is slow to compute; the choice is what is tested
        rel = release_ecdf(np.arange(size) * 1.0, grid, mechanism="auto", privacy="zcdp", rho=0.5)
        assert isinstance(rel.mechanism, SqrtFactorizationMechanism if choice == "factorization" else GaussianTreeMechanism)
    # a task's default: before the policy table, a zCDP task on a large grid defaulted to the factorization,
    # which then refused the grid
    spec = {"kind": "thresholds", "values": list(map(float, range(size)))}
    assert TaskConfig.default_mechanism(spec, "substitution", "zcdp") == choice


def test_a_task_past_the_largest_tree_takes_the_tree_and_its_clear_refusal():
    spec = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 21}
    assert 1 << 21 > MAX_TREE_SIZE and auto_mechanism(1 << 21, "substitution") == "adaptive"
    assert TaskConfig.default_mechanism(spec, "substitution") == "tree"


@pytest.mark.parametrize("payload, want", [("count", (1.0, "substitution")), ("label", (0.5, "add-remove")),
                                           ("calibration", (0.3, "substitution"))])
def test_each_payload_spends_its_budget_as_the_table_says_and_a_task_follows_it(payload, want):
    assert curve_budget(payload, 1.0, "substitution", split=0.3) == want
    config = TaskConfig(grid={"kind": "uniform", "lo": 0, "hi": 1, "bits": 6}, epsilon=1.0, mechanism="path",
                        relation="substitution", min_batch=0, servers=("http://a", "http://b"), hpke_keys=("00", "01"),
                        token_hash="0" * 64, verify=False, task_id="t1", payload=payload, split=0.3)
    mech = config.make_mechanism()
    assert mech.epsilon == pytest.approx(want[0]) and mech.relation == want[1]


@pytest.mark.parametrize("payload, want", [("count", (1.0, "substitution")), ("label", (0.5, "add-remove")),
                                           ("calibration", (0.3, "substitution"))])
def test_a_zcdp_task_splits_rho_as_the_table_splits_epsilon(payload, want):
    """zCDP composes additively in rho: the same table, the Gaussian tree at each curve's share (issue 25)."""
    assert curve_budget(payload, 1.0, "substitution", split=0.3) == want
    config = TaskConfig(grid={"kind": "uniform", "lo": 0, "hi": 1, "bits": 6}, epsilon=None, mechanism="tree",
                        relation="substitution", min_batch=0, servers=("http://a", "http://b"), hpke_keys=("00", "01"),
                        token_hash="0" * 64, verify=False, task_id="t1", payload=payload, split=0.3, privacy="zcdp", rho=1.0)
    mech = config.make_mechanism()
    assert isinstance(mech, GaussianTreeMechanism)
    assert mech.rho == pytest.approx(want[0]) and mech.relation == want[1]
    assert auto_mechanism(64, "substitution", "zcdp", payload=payload) == ("factorization" if payload == "count" else "tree")
