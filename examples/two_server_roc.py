"""A DP ROC curve computed by two real servers: each test case sends one DCF key per server with
payload (label, 1 - label); the analyst gets both curves at once and never sees a score or a label.

    python examples/two_server_roc.py [--epsilon 1] [--out two_server_roc.png]
"""
from __future__ import annotations

import argparse
import sys
import tempfile

try:  # the one extra these examples need: pip install -e '.[examples]'
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score, roc_curve
except ImportError:
    sys.exit("this example needs scikit-learn: pip install -e '.[examples]' (or pip install scikit-learn)")

from dpcdf.analyst import Analyst
from dpcdf.service.client import create_task, submit
from dpcdf.apps.plots import save_roc
from dpcdf.service.processes import start_server, stop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--out", default="two_server_roc.png")
    args = ap.parse_args()
    x, y = make_classification(n_samples=6000, n_features=8, n_informative=4, flip_y=0.1, random_state=3)
    model = LogisticRegression(max_iter=1000).fit(x[:3000], y[:3000])
    scores, labels = model.predict_proba(x[3000:])[:, 1], y[3000:]
    with tempfile.TemporaryDirectory() as tmp:
        procs = [start_server(p, f"{tmp}/s{p}") for p in (0, 1)]
        try:
            config, token = create_task([u for _, u in procs], {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 10},
                                        args.epsilon, "tree", "substitution", min_batch=100, payload="label")
            submit(config, scores, labels=labels)
            roc = Analyst(config, token).roc()
        finally:
            for proc, _ in procs:
                stop(proc)
    print(f"{labels.size} test cases over two servers: true AUC {roc_auc_score(labels, scores):.4f}, DP AUC {roc.auc:.4f}")
    print(roc.statement + "; each server adds its own full noise")
    fpr, tpr, _ = roc_curve(labels, scores)
    save_roc(args.out, {"true": (fpr, tpr), f"two servers, eps={args.epsilon}": (roc.fpr, roc.tpr)})

if __name__ == "__main__":
    main()
