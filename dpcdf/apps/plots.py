"""PNG plots for the examples and the demo (matplotlib, imported only when a plot is asked for)."""
from __future__ import annotations


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_roc(path: str, curves: dict) -> None:
    """ROC curves {label: (fpr, tpr)}; the first is drawn in black (the true curve)."""
    plt = _pyplot()
    plt.figure(figsize=(4.5, 4.5))
    for k, (label, (fpr, tpr)) in enumerate(curves.items()):
        plt.plot(fpr, tpr, label=label, **({"color": "black"} if k == 0 else {}))
    plt.xlabel("false positive rate")
    plt.ylabel("true positive rate")
    plt.legend(loc="lower right")
    plt.tight_layout()
    plt.savefig(path, dpi=120)
    plt.close()
    print(f"wrote {path}")
