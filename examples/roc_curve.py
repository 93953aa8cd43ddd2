"""DP ROC curves of a logistic regression on scikit-learn's breast-cancer data (the paper's Figures 1,
8 and 9): the true curve and DP curves at several epsilons, with AUC and the L1 area between curves.

    python examples/roc_curve.py [--out roc_curve.png]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
try:  # the one extra these examples need: pip install -e '.[examples]'
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
except ImportError:
    sys.exit("this example needs scikit-learn: pip install -e '.[examples]' (or pip install scikit-learn)")

import dpcdf
from dpcdf.apps.plots import save_roc
from dpcdf.apps.roc import l1_area

EPSILONS = (0.5, 1.0, 4.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="roc_curve.png")
    args = ap.parse_args()
    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.5, random_state=0, stratify=y)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(x_train, y_train)
    scores = model.predict_proba(x_test)[:, 1]
    grid = dpcdf.Grid.uniform(0, 1, bits=10)
    exact = dpcdf.roc(scores, y_test, grid, 1.0, noise=lambda ids, s: np.zeros(np.asarray(ids).size, np.int64))
    print(f"{len(y_test)} test cases; true AUC {roc_auc_score(y_test, scores):.4f} (on the grid: {exact.auc:.4f})")
    dp_curves = {}
    for eps in EPSILONS:
        r = dpcdf.roc(scores, y_test, grid, eps)
        dp_curves[eps] = r
        print(f"eps={eps:<4} DP AUC {r.auc:.4f}  L1 area to the true curve {l1_area(r.fpr, r.tpr, exact.fpr, exact.tpr):.4f}")
    print(dp_curves[EPSILONS[0]].statement)
    curves = {f"true (AUC {exact.auc:.3f})": (exact.fpr, exact.tpr)}
    curves.update({f"DP eps={eps} (AUC {r.auc:.3f})": (r.fpr, r.tpr) for eps, r in dp_curves.items()})
    save_roc(args.out, curves)

if __name__ == "__main__":
    main()
