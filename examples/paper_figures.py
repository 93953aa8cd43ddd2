"""Reproduces Figures 2, 3 and 4 of Barczewski, Mawass, Ramon (DP ECDFs) with our implementation of
the paper's mechanism (eq. 2 at the paper's scale (L+1)/eps) and smoothing (eq. 3), on the paper's
synthetic data X_pois(lambda) (for every value i in [N], Poisson(lambda) instances). Writes PNGs and
prints the numbers.

    python examples/paper_figures.py [--bits 15] [--runs 100] [--out figures]

Defaults (bits 12, 10 runs) take about a minute; the paper used N = 2^15 and 100 runs.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import dpcdf
from dpcdf import Grid, PathMechanism

EPSILONS = [0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
LAMBDAS = [0.5, 1, 2, 3, 5, 10, 20]


def data(n_bins: int, lam: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)  # the synthetic data set, not privacy noise
    return np.repeat(np.arange(n_bins), rng.poisson(lam, n_bins))


def paper_release(values: np.ndarray, grid: Grid, eps: float) -> dpcdf.Release:
    mech = PathMechanism(grid.size, eps, calibration="paper")
    return dpcdf.release_ecdf(values, grid, eps, mech, postprocess_with="none")


def smoothing_ratio(values: np.ndarray, grid: Grid, eps: float, p: int, runs: int) -> float:
    """||F - F_smooth||^2 / ||F - F_hat||^2 averaged over runs (the y axis of Figures 2 and 3)."""
    truth = dpcdf.prefix_counts(values, grid) / values.size
    ratios = []
    for _ in range(runs):
        rel = paper_release(values, grid, eps)
        raw = rel.raw / values.size
        smooth = rel.smooth(p).counts / values.size
        ratios.append(np.sum((truth - smooth) ** 2) / np.sum((truth - raw) ** 2))
    return float(np.mean(ratios))


def inverse_errors(values: np.ndarray, grid: Grid, eps: float, runs: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """MSE of F_hat at uniform points, and of the inverse ECDF by Algorithm 1 on F_hat and on the
    L2-smoothed F (in units of the domain, normalised to [0, 1])."""
    truth = dpcdf.prefix_counts(values, grid) / values.size
    f_err, inv_raw, inv_smooth = [], [], []
    exact = dpcdf.release_ecdf(values, grid, 1.0, PathMechanism(grid.size, 1.0), postprocess_with="none",
                               noise=lambda ids, s: np.zeros(np.asarray(ids).size, np.int64))
    for _ in range(runs):
        rel = paper_release(values, grid, eps)
        xs = rng.integers(0, grid.size, 200)
        ps = rng.uniform(0.01, 0.99, 200)
        f_err.append(np.mean((truth[xs] - rel.raw[xs] / values.size) ** 2))
        q_true = exact.quantile(ps)
        inv_raw.append(np.mean(((rel.quantile(ps, method="bisect") - q_true) / grid.size) ** 2))
        inv_smooth.append(np.mean(((rel.smooth(2).quantile(ps) - q_true) / grid.size) ** 2))
    return float(np.mean(f_err)), float(np.mean(inv_raw)), float(np.mean(inv_smooth))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", type=int, default=12)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", default="figures")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_bins = 1 << args.bits
    grid = Grid.integers(n_bins)
    rng = np.random.default_rng(11)

    print(f"Figure 2: smoothing effect vs epsilon, lambda = 3, N = 2^{args.bits}, {args.runs} runs")
    x3 = data(n_bins, 3, 1)
    fig2 = {p: [smoothing_ratio(x3, grid, e, p, args.runs) for e in EPSILONS] for p in (1, 2)}
    for e, r1, r2 in zip(EPSILONS, fig2[1], fig2[2]):
        print(f"  eps={e:<5} p=1: {r1:.3f}  p=2: {r2:.3f}")

    print("Figure 3: smoothing effect vs lambda, epsilon = 1")
    fig3 = {p: [smoothing_ratio(data(n_bins, lam, 2), grid, 1.0, p, args.runs) for lam in LAMBDAS] for p in (1, 2)}
    for lam, r1, r2 in zip(LAMBDAS, fig3[1], fig3[2]):
        print(f"  lambda={lam:<4} p=1: {r1:.3f}  p=2: {r2:.3f}")

    print("Figure 4: ECDF and inverse ECDF errors vs epsilon, lambda = 3")
    fig4 = [inverse_errors(x3, grid, e, args.runs, rng) for e in EPSILONS]
    for e, (fe, ir, ism) in zip(EPSILONS, fig4):
        print(f"  eps={e:<5} F_hat MSE {fe:.2e}  inverse(F_hat) MSE {ir:.2e}  inverse(F_smooth) MSE {ism:.2e}")

    for name, xs, series, xlabel in (
        ("figure2_smoothing_vs_epsilon.png", EPSILONS, fig2, "epsilon"),
        ("figure3_smoothing_vs_lambda.png", LAMBDAS, fig3, "lambda"),
    ):
        plt.figure(figsize=(5, 3.5))
        for p, ys in series.items():
            plt.plot(xs, ys, marker="o", label=f"{p}-norm smoothing")
        plt.axhline(1, color="grey", lw=0.8)
        plt.xscale("log")
        plt.xlabel(xlabel)
        plt.ylabel("||F - F_smooth||^2 / ||F - F_hat||^2")
        plt.legend()
        plt.tight_layout()
        plt.savefig(out / name, dpi=120)
        plt.close()
    plt.figure(figsize=(5, 3.5))
    for k, label in enumerate(["F_hat", "inverse of F_hat (Alg. 1)", "inverse of smoothed F"]):
        plt.plot(EPSILONS, [row[k] for row in fig4], marker="o", label=label)
    plt.xscale("log")
    plt.yscale("log")
    plt.xlabel("epsilon")
    plt.ylabel("mean squared error")
    plt.legend()
    plt.tight_layout()
    plt.savefig(out / "figure4_inverse_ecdf.png", dpi=120)
    plt.close()
    print(f"wrote {out}/figure2_smoothing_vs_epsilon.png, figure3_smoothing_vs_lambda.png, figure4_inverse_ecdf.png")


if __name__ == "__main__":
    main()
