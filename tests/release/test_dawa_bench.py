"""bench/dawa.py, the DAWA peer of bench/accuracy_sweep.py: its deviations, its least-squares tree, and
on a piecewise-constant histogram its partition (the pieces' boundaries), its shape and its bias."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PIECES = np.array([300, 40, 0, 900, 120]), np.array([200, 300, 100, 24, 400])  # counts per bin, widths
HIST = np.repeat(*PIECES).astype(np.int64)  # 1,024 bins
BOUNDARIES = set(np.cumsum(PIECES[1])[:-1].tolist())


@pytest.fixture(scope="module")
def dawa():
    spec = importlib.util.spec_from_file_location("dawa", ROOT / "bench" / "dawa.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # numba's cache finds the module by its name, the one bench/accuracy_sweep.py imports
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("median", [True, False])
def test_deviations_match_brute_force(dawa, median):
    x = np.random.default_rng(3).integers(0, 9, 40) * np.arange(40) // 7
    dev = dawa._deviations(x.astype(np.int64), median)
    for k in range(1, dev.shape[0]):
        for s in range(x.size - (1 << k) + 1):
            w = x[s : s + (1 << k)]
            want = np.abs(w - np.median(w)).sum() if median else np.floor(np.abs(w - w.mean()).sum() + 0.5)
            assert dev[k, s] == want


def test_consistent_tree_is_the_least_squares_fit(dawa):
    b, h = 3, 2
    rng = np.random.default_rng(4)
    y = [rng.normal(size=b ** (h - lv)) for lv in range(h + 1)]
    var = [1.0, 2.5, 0.0]  # the root exact, as under substitution
    got = dawa.consistent(y, var, b)
    # generalised least squares, the exact root as a constraint: minimise sum_l |A_l x - y_l|^2 / var_l
    rows = [np.kron(np.eye(b ** (h - lv)), np.ones(b**lv)) for lv in range(h)]
    a = np.vstack([r / np.sqrt(v) for r, v in zip(rows, var)])
    rhs = np.concatenate([yl / np.sqrt(v) for yl, v in zip(y[:h], var[:h])])
    kkt = np.block([[a.T @ a, np.ones((b**h, 1))], [np.ones((1, b**h)), np.zeros((1, 1))]])
    want = np.linalg.solve(kkt, np.concatenate([a.T @ rhs, y[-1]]))[: b**h]
    np.testing.assert_allclose(got, want, atol=1e-9)


@pytest.mark.parametrize("relation", ["add-remove", "substitution"])
def test_partition_recovers_the_pieces(dawa, relation):
    for _ in range(3):
        starts = dawa.partition(HIST, 2.5, 7.5, relation)
        assert starts[0] == 0 and np.all(np.diff(starts) > 0)
        assert BOUNDARIES <= set(starts.tolist())
        lengths = np.diff(np.append(starts, HIST.size))
        assert set(np.log2(lengths)) <= set(range(11))  # dyadic buckets
        assert starts.size <= 25  # the fewest dyadic buckets that tile the pieces: 4 + 2 + 3 + 2 + 5 = 16


def test_prefix_estimate_has_the_right_shape_and_no_visible_bias(dawa):
    truth = np.cumsum(HIST)
    runs = np.array([dawa.dawa_prefix(HIST, 1.0, "add-remove") for _ in range(40)])
    assert runs.shape == (40, HIST.size) and runs.dtype == np.float64
    err = runs - truth
    z = err.mean(axis=0) / (err.std(axis=0, ddof=1) / np.sqrt(len(runs)))
    assert np.abs(z).max() < 4.5 and abs(z.mean()) < 2
    assert np.sqrt((err**2).mean()) < 0.01 * truth[-1]
    sub = dawa.dawa_prefix(HIST, 1.0, "substitution", cost="median", clip=False)
    assert sub.shape == HIST.shape and np.isfinite(sub).all()
