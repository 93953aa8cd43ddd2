"""The DP Hosmer-Lemeshow statistic's relative squared error against epsilon (the paper's Figures 6
and 10), for a logistic regression on a synthetic classification task of scikit-learn's.

    python examples/hosmer_lemeshow.py [--runs 20] [--out hosmer_lemeshow.png]
"""
from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression

import dpcdf
from dpcdf.hosmer_lemeshow import exact_hosmer_lemeshow

EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default="hosmer_lemeshow.png")
    args = ap.parse_args()
    x, y = make_classification(n_samples=20000, n_features=8, n_informative=4, flip_y=0.1, random_state=1)
    model = LogisticRegression(max_iter=1000).fit(x[:10000], y[:10000])
    p, labels = model.predict_proba(x[10000:])[:, 1], y[10000:]
    edges = np.quantile(p, np.linspace(0, 1, 11))
    h = exact_hosmer_lemeshow(p, labels, edges)
    print(f"non-private H = {h:.2f} over 10 decile groups, n = {p.size}")
    rel = []
    for eps in EPSILONS:
        runs = [dpcdf.hosmer_lemeshow(p, labels, eps) for _ in range(args.runs)]
        mse = np.mean([(r.statistic - h) ** 2 for r in runs]) / h**2
        rel.append(mse)
        print(f"eps={eps:<5} relative MSE of H {mse:.3g}  (groups dropped on average {np.mean([r.dropped for r in runs]):.1f})")
    print(runs[0].statement)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.figure(figsize=(5, 3.5))
    plt.plot(EPSILONS, rel, marker="o")
    plt.xscale("log")
    plt.yscale("log")
    plt.xlabel("epsilon")
    plt.ylabel("relative MSE of the HL statistic")
    plt.tight_layout()
    plt.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
