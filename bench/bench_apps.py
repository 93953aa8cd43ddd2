"""Applications side by side, same data and epsilon.

    python bench/bench_apps.py [--runs 20]

1. ROC: AUC error and L1 area between the true and the DP ROC curve, against epsilon (logistic
   regression scores on scikit-learn's breast-cancer test split, and on a larger synthetic task).
2. Hosmer-Lemeshow: relative MSE of the DP statistic against epsilon, and how often its test verdict
   (noise-aware p-value < 0.05) is the true one: the paper's Algorithm 2 against noise on the statistic alone (a bounded
   H, `dpcdf.hosmer_lemeshow_direct`), on calibrated, rare-positive and miscalibrated scores.
3. Local DP vs two servers vs central, at the same epsilon (counts MSE of the ECDF on the paper's
   data, N = 1024): the local baseline is a hierarchical histogram with generalized randomized
   response (each person reports the node holding their value at one random level of a b-ary tree,
   the lecture's and u-statistics paper's construction); two servers = central mechanism with both
   servers' independent noise, post-processed knowing it (what the analyst gets).
"""
from __future__ import annotations

import argparse
import math

import numpy as np
from scipy import stats
from sklearn.datasets import load_breast_cancer, make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import dpcdf
from dpcdf import Grid, metrics
from dpcdf.apps.hosmer_lemeshow import exact_hosmer_lemeshow
from dpcdf.release.adaptive import AdaptiveMechanism
from dpcdf.release.mechanisms import TreeMechanism
from dpcdf.release.noise import secure_noise
from dpcdf.release.ecdf import finish_release
from dpcdf.apps.roc import l1_area

EPS = (0.1, 0.5, 1.0, 2.0, 5.0)


def zero(ids, scale):
    return np.zeros(np.asarray(ids).size, np.int64)


def scores_sets():
    x, y = load_breast_cancer(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.5, random_state=0, stratify=y)
    m = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(xtr, ytr)
    xs, ys = make_classification(n_samples=40000, n_features=10, n_informative=5, flip_y=0.2, random_state=2)
    ms = LogisticRegression(max_iter=1000).fit(xs[:20000], ys[:20000])
    return {"breast cancer (n=285)": (m.predict_proba(xte)[:, 1], yte),
            "synthetic (n=20000)": (ms.predict_proba(xs[20000:])[:, 1], ys[20000:])}


def ldp_hierarchical(values: np.ndarray, n_bins: int, eps: float, b: int = 4) -> np.ndarray:
    """Local DP prefix counts: each person picks a level uniformly (public coin), reports the node
    holding their value through generalized randomized response over that level's nodes; the
    aggregator debiases each level's counts and answers prefixes from the covering nodes."""
    rng = np.random.default_rng()  # simulation only: a real client would use a CSPRNG
    shape = TreeMechanism(n_bins, 1.0, branching=b).shape
    levels = shape.height
    pick = rng.integers(0, levels, values.size)
    nodes = []
    for level in range(levels):
        width = b**level
        k = math.ceil(n_bins / width)
        mine = values[pick == level] // width
        keep = rng.random(mine.size) < math.exp(eps) / (math.exp(eps) + k - 1)
        other = rng.integers(0, k - 1, mine.size)
        reported = np.where(keep, mine, other + (other >= mine))
        counts = np.bincount(reported, minlength=k).astype(float)
        p = math.exp(eps) / (math.exp(eps) + k - 1)
        q = 1 / (math.exp(eps) + k - 1)
        nodes.append((counts - mine.size * q) / (p - q) * levels)
    nodes.append(np.array([float(values.size)]))
    mech = TreeMechanism(n_bins, 1.0, branching=b)
    return mech.covering_prefix(nodes)


def hl_sets() -> dict:
    rng = np.random.default_rng(11)  # simulated data only
    sets = {}
    for name, (a, b) in {"calibrated": (2, 2), "calibrated, rare positives": (0.6, 5)}.items():
        p = rng.beta(a, b, 20000)
        sets[f"{name} (n=20000)"] = (p, (rng.random(p.size) < p).astype(int))
    sets["miscalibrated (n=20000)"] = scores_sets()["synthetic (n=20000)"]
    return sets


def hosmer_lemeshow_table(runs: int) -> None:
    """Algorithm 2 (noisy group counts, the paper's) against noise on the statistic alone (the
    paper's alternative, `hosmer_lemeshow_direct`) with public floors and caps."""
    methods = {
        "Algorithm 2 (noisy n, O, E)": lambda p, y, eps: dpcdf.hosmer_lemeshow(p, y, eps),
        "noisy H, floor 5, cap 26": lambda p, y, eps: dpcdf.hosmer_lemeshow_direct(p, y, eps),
        "noisy H, floor 100, cap 26": lambda p, y, eps: dpcdf.hosmer_lemeshow_direct(p, y, eps, floor=100.0),
        "noisy H, floor 100, cap 400": lambda p, y, eps: dpcdf.hosmer_lemeshow_direct(p, y, eps, floor=100.0, clip=400.0),
    }
    for name, (p, y) in hl_sets().items():
        h = exact_hosmer_lemeshow(p, y, np.quantile(p, np.linspace(0, 1, 11)))
        reject = stats.chi2.sf(h, 8) < 0.05
        print(f"{name}, H = {h:.1f}")
        print(f"  {'method':<30}" + "".join(f"{'eps=' + str(e):>16}" for e in EPS))
        for label, method in methods.items():
            cells = []
            for eps in EPS:
                rs = [method(p, y, eps) for _ in range(runs)]
                mse = np.mean([(r.statistic - h) ** 2 for r in rs]) / h**2
                agree = 100 * np.mean([(r.noise_aware_p_value < 0.05) == reject for r in rs])
                cells.append(f"{mse:>9.3g} /{agree:>4.0f}")
            print(f"  {label:<30}" + "".join(f"{c:>16}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    grid = Grid.uniform(0, 1, bits=10)
    print("1. ROC: mean |AUC error| / mean L1 area between curves")
    print(f"{'data':<24}" + "".join(f"{'eps=' + str(e):>18}" for e in EPS))
    for name, (s, y) in scores_sets().items():
        exact = dpcdf.roc(s, y, grid, 1.0, noise=zero)
        cells = []
        for eps in EPS:
            rs = [dpcdf.roc(s, y, grid, eps) for _ in range(args.runs)]
            auc = np.mean([abs(r.auc - exact.auc) for r in rs])
            l1 = np.mean([l1_area(r.fpr, r.tpr, exact.fpr, exact.tpr) for r in rs])
            cells.append(f"{auc:>8.4f} / {l1:<7.4f}")
        print(f"{name:<24}" + "".join(f"{c:>18}" for c in cells))

    print("\n2. Hosmer-Lemeshow, 10 groups: relative MSE of H / % of runs whose noise-aware p-value gives the true verdict at 5%")
    hosmer_lemeshow_table(args.runs)

    print("\n3. ECDF counts MSE on the paper's data (N = 1024): local DP vs two servers vs central")
    rng = np.random.default_rng(7)
    n_bins = 1024
    values = np.repeat(np.arange(n_bins), rng.poisson(3, n_bins))
    g = Grid.integers(n_bins)
    truth = dpcdf.prefix_counts(values, g)
    two = lambda ids, sc: secure_noise(np.asarray(ids).size, sc) + secure_noise(np.asarray(ids).size, sc)  # noqa: E731
    print(f"{'method':<24}" + "".join(f"{'eps=' + str(e):>18}" for e in EPS))
    for label in ("local DP (hierarchical)", "two servers", "central"):
        cells = []
        for eps in EPS:
            errs = []
            for _ in range(args.runs):
                if label.startswith("local"):
                    est = ldp_hierarchical(values, n_bins, eps)
                elif label == "central":
                    est = dpcdf.release_ecdf(values, g, eps).counts
                else:  # the default task (adaptive), each value carrying both servers' noise
                    mech = AdaptiveMechanism(n_bins, eps)
                    est = finish_release(g, mech, mech.noisy(truth, two, copies=2), values.size, copies=2).counts
                errs.append(metrics.mse_counts(truth, est))
            cells.append(f"{np.mean(errs):>18.0f}")
        print(f"{label:<24}" + "".join(cells))


if __name__ == "__main__":
    main()
