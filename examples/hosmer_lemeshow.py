"""The DP Hosmer-Lemeshow statistic's relative squared error against epsilon (the paper's Figures 6
and 10), for a logistic regression on simulated data with 20% positives (like the paper's Bank data,
a well-specified model with small expected counts in the lowest groups): the paper's Algorithm 2
(noisy group counts) and the alternative it names, noise on the statistic alone
(`dpcdf.hosmer_lemeshow_direct`, central mode, with a public floor of 20 on the expected counts and the
default cap per group).

    python examples/hosmer_lemeshow.py [--runs 20] [--out hosmer_lemeshow.png]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
try:  # the one extra these examples need: pip install -e '.[examples]'
    from sklearn.linear_model import LogisticRegression
except ImportError:
    sys.exit("this example needs scikit-learn: pip install -e '.[examples]' (or pip install scikit-learn)")

import dpcdf
from dpcdf.apps.hosmer_lemeshow import exact_hosmer_lemeshow

EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default="hosmer_lemeshow.png")
    args = ap.parse_args()
    rng = np.random.default_rng(1)  # simulated data only
    x = rng.normal(size=(40000, 8))
    y = (rng.random(40000) < 1 / (1 + np.exp(2.5 - x @ (0.8 * rng.normal(size=8))))).astype(int)
    model = LogisticRegression(max_iter=1000).fit(x[:20000], y[:20000])
    p, labels = model.predict_proba(x[20000:])[:, 1], y[20000:]
    edges = np.quantile(p, np.linspace(0, 1, 11))
    h = exact_hosmer_lemeshow(p, labels, edges)
    print(f"non-private H = {h:.2f} over 10 decile groups, n = {p.size}")
    methods = {"Algorithm 2 (noisy n, O, E)": lambda eps: dpcdf.hosmer_lemeshow(p, labels, eps),
               "noise on H alone (floor 20)": lambda eps: dpcdf.hosmer_lemeshow_direct(p, labels, eps, floor=20.0)}
    rel = {}
    for name, method in methods.items():
        rel[name] = []
        for eps in EPSILONS:
            runs = [method(eps) for _ in range(args.runs)]
            rel[name].append(np.mean([(r.statistic - h) ** 2 for r in runs]) / h**2)
            print(f"{name:<30} eps={eps:<5} relative MSE of H {rel[name][-1]:.3g}")
        print(runs[0].statement)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.figure(figsize=(5, 3.5))
    for name, values in rel.items():
        plt.plot(EPSILONS, values, marker="o", label=name)
    plt.legend()
    plt.xscale("log")
    plt.yscale("log")
    plt.xlabel("epsilon")
    plt.ylabel("relative MSE of the HL statistic")
    plt.tight_layout()
    plt.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
