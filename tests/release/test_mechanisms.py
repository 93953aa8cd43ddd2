"""Mechanisms: tree geometry pinned on small examples, exact sensitivities, privacy statements, and
the noise's error where the theory puts it."""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpcdf
from dpcdf import ParameterError, PathMechanism, TreeMechanism
from dpcdf.release.mechanisms import ROOT_SHARE, node_counts
from dpcdf.release.noise import dlaplace_variance, secure_noise
from dpcdf.release.tree import LEVEL_SHIFT, TreeShape, path_sensitivity, path_sensitivity_bruteforce
from helpers import neighbour_prefixes


def test_binary_tree_geometry_on_8_leaves():
    s = TreeShape.for_size(8, 2)
    assert (s.branching, s.height) == (2, 3)
    # leaf 5: level 0 node 5, level 1 node 2 (leaves 4-5), level 2 node 1 (4-7), root
    ids = s.path([5])[0]
    assert [(int(i) >> LEVEL_SHIFT, int(i) & ((1 << LEVEL_SHIFT) - 1)) for i in ids] == [(0, 5), (1, 2), (2, 1), (3, 0)]
    assert s.covering(5) == [(2, 0), (1, 2)]  # [0, 5] = [0, 3] + [4, 5]
    assert s.covering(6) == [(2, 0), (1, 2), (0, 6)]
    assert s.covering(7) == [(3, 0)]
    assert s.covering(0) == [(0, 0)]


def test_ternary_tree_with_padding():
    s = TreeShape.for_size(10, 3)  # 27 padded leaves
    assert (s.height, s.covering(8), s.covering(9)) == (3, [(2, 0)], [(2, 0), (0, 9)])
    assert s.covering(4) == [(1, 0), (0, 3), (0, 4)]


@pytest.mark.parametrize("size,b", [(8, 2), (10, 3), (64, 4), (100, 7), (27, 3)])
def test_covering_counts_match_the_coverings(size, b):
    s = TreeShape.for_size(size, b)
    want = np.zeros(s.height + 1, np.int64)
    for i in range(size):
        for level, _ in s.covering(i):
            want[level] += 1
    np.testing.assert_array_equal(s.covering_counts(), want)


@pytest.mark.parametrize("height", range(1, 8))
def test_path_sensitivity_closed_form_matches_the_brute_force(height):
    n = 1 << height
    assert path_sensitivity_bruteforce(n, "substitution") == path_sensitivity(height, "substitution") == height
    assert path_sensitivity_bruteforce(n, "add-remove") == path_sensitivity(height, "add-remove") == math.ceil((height + 1) / 2)


def test_fewer_data_leaves_never_need_more():
    for size in (3, 5, 6, 7, 11, 13):
        h = math.ceil(math.log2(size))
        assert path_sensitivity_bruteforce(size, "substitution") <= path_sensitivity(h, "substitution")


def test_statements_and_epsilon_accounting():
    p = PathMechanism(1024, 1.0, "substitution")
    assert p.sensitivity("substitution") == 10 and float(p.scale) == 10
    assert p.epsilon_for("substitution") == pytest.approx(1.0)
    assert p.epsilon_for("add-remove") == pytest.approx(0.6)  # ceil(11/2) = 6 shifts at the same scale
    assert "1-DP under substitution" in p.statement()
    paper = PathMechanism(1024, 1.0, calibration="paper")
    assert float(paper.scale) == 11
    t = TreeMechanism(1000, 0.5, "add-remove")
    assert t.epsilon_for("add-remove") == pytest.approx(0.5, rel=1e-5) and t.epsilon_for("add-remove") <= 0.5
    # n is not public: the root is noised and released, with a fixed share of epsilon, also when the grid
    # does not fill the padded tree (every normalised value rests on it)
    assert t.shape.branching**t.shape.height > 1000 and t.noised_levels()[-1] == t.shape.height
    assert t.budgets[-1] == pytest.approx(0.5 * ROOT_SHARE) and sum(t.budgets) <= 0.5
    full = TreeMechanism(1024, 0.5, "add-remove", branching=2)
    assert full.noised_levels()[-1] == full.shape.height == 10 and full.budgets[-1] == pytest.approx(0.5 * ROOT_SHARE)
    gauss = dpcdf.gaussian_tree(1000, 0.5, "add-remove")  # the zCDP tree (equal sigma^2 per level): a full tree only
    assert gauss.shape.height not in gauss.released_levels()
    s = TreeMechanism(1000, 0.5, "substitution")
    assert s.epsilon_for("add-remove") == math.inf and s.scales[-1] is None
    assert s.epsilon_for("substitution") <= 0.5


def test_tree_choice_is_the_exact_minimum():
    size, eps = 300, 1.0
    best = TreeMechanism(size, eps)
    for b in (2, 3, 4, 8, 16, 17, 32, 300):
        assert best.expected_mse() <= TreeMechanism(size, eps, branching=b).expected_mse() * (1 + 1e-9)


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: PathMechanism(8, 0), "epsilon"),
        (lambda: PathMechanism(8, 1.0, "swap"), "relation"),
        (lambda: PathMechanism(8, 1.0, calibration="loose"), "calibration"),
        (lambda: TreeMechanism(8, 1.0, branching=1), "branching"),
        (lambda: TreeMechanism(8, 1.0, branching=2, budgets=(0.5, 0.5, 0.5)), "exceed epsilon"),
        (lambda: TreeMechanism(8, 1.0, branching=2, budgets=(1.0,)), "level budgets"),
    ],
)
def test_bad_mechanisms(build, message):
    with pytest.raises(ParameterError, match=message):
        build()


def _noise(ids, scale):
    return secure_noise(np.asarray(ids).size, scale)


def _path_mse(mech: PathMechanism, runs: int) -> tuple[float, float]:
    zero = np.zeros(mech.size, np.int64)
    per_run = np.array([np.mean(mech.noisy_prefix(zero, _noise).astype(np.float64) ** 2) for _ in range(runs)])
    return float(per_run.mean()), float(per_run.std() / math.sqrt(runs))


def test_paper_path_mechanism_error_is_theorem_3_1():
    """Eq. 2 at the paper's scale (L + 1) / eps: MSE 2 (L + 1)^3 / eps^2 (Theorem 3.1), within 5%."""
    mech = PathMechanism(256, 1.0, calibration="paper")  # L = 8
    theory = 2 * 9**3
    mse, se = _path_mse(mech, 2500)
    assert abs(mse / theory - 1) < 0.05
    assert abs(mse - mech.expected_mse()) < 5 * se  # and exactly at the discrete Laplace's variance


def test_exact_path_mechanism_error_is_its_prediction():
    mech = PathMechanism(256, 0.5)  # scale L / eps = 16
    mse, se = _path_mse(mech, 2500)
    assert mech.expected_mse() == pytest.approx(9 * dlaplace_variance(16))
    assert abs(mse - mech.expected_mse()) < 5 * se
    assert mse < 2 * 9**3 / 0.25  # below the paper's calibration


def test_tree_covering_error_is_its_prediction():
    mech = TreeMechanism(500, 1.0)
    zero = np.zeros(500, np.int64)
    runs = np.array([np.mean(mech.covering_prefix(mech.noisy_nodes(zero, _noise)) ** 2) for _ in range(1500)])
    assert abs(runs.mean() - mech.expected_mse()) < 5 * runs.std() / math.sqrt(runs.size)


@given(st.integers(2, 5000), st.floats(1e-3, 50), st.sampled_from(["substitution", "add-remove"]))
@settings(max_examples=200, deadline=None)
def test_tree_budgets_as_sampled_add_up_to_at_most_epsilon_exactly(size, epsilon, relation):
    """The level budgets the sampler really uses (delta / scale, rationals) never sum above epsilon,
    not even by a float rounding step (TreeMechanism(14, 7.77) used to, by 4e-16)."""
    from fractions import Fraction

    t = TreeMechanism(size, epsilon, relation)
    delta = t.level_sensitivity(relation)
    assert sum(delta / t.scales[level] for level in t.noised_levels()) <= Fraction(epsilon)


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
@pytest.mark.parametrize("size, branching", [(5, 2), (8, 2), (10, 3), (9, 3), (30, 4)])
def test_tree_epsilon_is_the_brute_force_worst_case(size, branching, relation):
    """Discrete Laplace on node counts: a neighbour pair costs sum over released levels of ||d_l||_1 /
    scale_l. Over every neighbour pair of the mechanism's own release the worst case is exact_epsilon,
    at most epsilon; a released level without noise (the public root under substitution) never changes.
    Under add/remove the root is noised with its own share, also when the grid does not fill the tree."""
    mech = TreeMechanism(size, 0.7, relation, branching=branching)
    assert (mech.shape.height in mech.noised_levels()) == (relation == "add-remove")
    worst = Fraction(0)
    for p, q in neighbour_prefixes(size, relation):
        loss = Fraction(0)
        for level in mech.released_levels():
            d = int(np.abs(node_counts(p, mech.shape, level) - node_counts(q, mech.shape, level)).sum())
            if mech.scales[level] is None:
                assert d == 0
            else:
                loss += Fraction(d) / mech.scales[level]
        worst = max(worst, loss)
    assert worst == mech.exact_epsilon(relation) <= Fraction(0.7)
