"""The default's smoothing against the plain fit, on the same releases (paired: one noise draw, both
post-processings), so the comparison is not drowned by the spread of independent runs.

    python bench/bench_smoothing.py [--runs 100]

For each data set of `bench_accuracy.py`, relation and epsilon: the plain fit's counts MSE (the b-ary
tree, consistent, monotone: `postprocess_with="monotone"`), the smoothed release's MSE over it
(`"smooth"`, the default `"auto"` on grids of up to 2^12 points), the share of runs where smoothing did
worse and its worst single-run ratio, and the mean quantile error (grid units) of both.
"""
from __future__ import annotations

import argparse

import numpy as np

import dpcdf
from dpcdf import Grid, metrics
from dpcdf.release.ecdf import finish_release, secure_node_noise

from bench_accuracy import datasets, quantile_error


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args()
    print(f"{args.runs} paired runs: counts MSE of the plain fit, smoothed / plain (mean), runs where smoothing is worse, "
          "its worst run, quantile error plain -> smoothed")
    print(f"{'relation':<13}{'data':<8}{'eps':>5}{'plain MSE':>11}{'smoothed/plain':>16}{'worse':>8}{'worst':>7}{'quantile':>18}")
    for relation in ("substitution", "add-remove"):
        for name, (data, size) in datasets().items():
            grid = Grid.integers(size)
            prefix = dpcdf.prefix_counts(data, grid)
            for eps in (0.1, 0.5, 1.0):
                mech = dpcdf.TreeMechanism(size, eps, relation)
                mse = np.zeros((args.runs, 2))
                qe = np.zeros((args.runs, 2))
                for r in range(args.runs):
                    noisy = mech.noisy(prefix, secure_node_noise)
                    for k, post in enumerate(("monotone", "smooth")):
                        rel = finish_release(grid, mech, noisy, data.size, post)
                        mse[r, k] = metrics.mse_counts(prefix, rel.counts)
                        qe[r, k] = quantile_error(prefix, rel, float(data.size), relation == "substitution")
                ratio = mse[:, 1] / mse[:, 0]
                short = name.split()[0].rstrip(":")
                print(f"{relation:<13}{short:<8}{eps:>5}{mse[:, 0].mean():>11.0f}{mse[:, 1].mean() / mse[:, 0].mean():>16.3f}"
                      f"{100 * np.mean(ratio > 1):>7.0f}%{ratio.max():>7.2f}{qe[:, 0].mean():>9.2f} -> {qe[:, 1].mean():.2f}")


if __name__ == "__main__":
    main()
