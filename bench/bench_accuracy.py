"""Accuracy of full-grid DP ECDF releases, side by side, at the same epsilon and neighbouring relation.

    python bench/bench_accuracy.py [--runs 20] [--relation substitution|add-remove] [--zcdp]
        [--only paper|skewed|sparse] [--n 10000 (values in the sparse set)]
    python bench/bench_accuracy.py --bands [--runs 100] [--level 0.95] [--zcdp] [--only ...]

--bands: `Release.confidence_band` instead (the tables above are not printed): per relation, data set
(the same three) and epsilon, the default release ("auto") and the tree's, `--runs` releases each:
how often the band contained the data's ECDF at every threshold (coverage; goal >= 93% at level 0.95)
and its mean width in F over the thresholds; then the width at eps 1, n = 5,000 on the 2^10 grid
(each data shape redrawn at n = 5,000; goal <= 0.05). With --zcdp also the zCDP default and the
discrete Gaussian tree at rho = 0.005, 0.125, 0.5. Each cell: coverage, then mean width.

Rows: the paper's path mechanism (eq. 2, scale (L+1)/eps) and its theory 2 (L+1)^3 / eps^2; the same
with the exact sensitivity; ours: the default ("auto": on grids of >= 256 points the two-round
adaptive mechanism, `dpcdf/release/adaptive.py`, under either relation), the b-ary
tree with the least exact expected error, consistent, its per-level details shrunk inside each node
by their exact noise variance, monotone, and the same tree releases with the plain monotone fit,
`postprocess_with="monotone"` (those two rows are paired, one noise draw per run); OpenDP's make_b_ary_tree + then_laplace + make_consistent_b_ary_tree at
b = 2 and 16; the Sarus post's histogram and adaptive-bisection methods (pure eps-DP Laplace versions,
their hyper-parameter picked by an oracle grid search, which favours them). Column: mean squared
error of the prefix counts over the grid; in parentheses: quantile error (mean |q - q_hat| in grid
units over p = 0.01 .. 0.99; ours through `Release.quantile`, the others by inverting their estimate
at its first crossing; under add/remove each divides by its own estimate of n, which is not public).

--zcdp adds rho-zCDP rows at rho = eps^2 / 2: ours (`privacy="zcdp"`: the default, the square-root
factorization with exact discrete Gaussian noise, monotone; and the discrete Gaussian b = 2 tree,
consistent, monotone) and OpenDP's make_b_ary_tree + make_gaussian (discrete Gaussian on integers)
made consistent, at b = 2 and at its default branching (`choose_branching_factor`: 26 at N = 1024),
its scale calibrated to the tree's exact L2 sensitivity under the relation (`opendp_zcdp_scale`), so
the b = 2 trees put the same sigma^2 on every node: 10 / rho (substitution) or 11 / (2 rho)
(add/remove) on the 2^10 grid.
"""
from __future__ import annotations

import argparse
import functools

import numpy as np

import dpcdf
from dpcdf import Grid, metrics
from dpcdf.release.ecdf import finish_release, secure_node_noise
from dpcdf.release.noise import scale_fraction, secure_noise

N = 1024
PS = np.linspace(0.01, 0.99, 99)
AUTO = "ours: auto (the default)"
TREE = "ours: b-ary tree, consistent, smoothed"
PLAIN = "ours: the same tree, plain monotone fit"


SPARSE_N = 1 << 12


def datasets(n_sparse: int = 10_000) -> dict[str, tuple[np.ndarray, int]]:
    """(values, grid size) per data set: the paper's, a skewed one, and a sparse one (n_sparse values
    in five narrow spikes, sd 2 grid units, on a 2^12 grid)."""
    rng = np.random.default_rng(7)  # data only
    paper = np.repeat(np.arange(N), rng.poisson(3, N))
    skewed = np.minimum(rng.exponential(25, 3000).astype(np.int64), N - 1)
    centres = np.array([300, 310, 1800, 2600, 3900])
    sparse = np.clip(np.rint(rng.normal(centres[rng.integers(0, 5, n_sparse)], 2)), 0, SPARSE_N - 1).astype(np.int64)
    return {"paper Poisson(3), n=%d" % paper.size: (paper, N), "skewed exponential, n=3000": (skewed, N),
            f"sparse: 5 spikes, n={n_sparse}": (sparse, SPARSE_N)}


def opendp_prefix(hist: np.ndarray, eps: float, b: int, d_in: int) -> np.ndarray:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int)
    size = hist.size
    tree = dp.t.make_b_ary_tree(*space, leaf_count=size, branching_factor=b)
    meas = dp.binary_search_chain(lambda s: tree >> dp.m.then_laplace(s), d_in=d_in, d_out=eps)
    leaves = dp.t.make_consistent_b_ary_tree(branching_factor=b)(meas([int(v) for v in hist]))
    return np.cumsum(np.asarray(leaves[:size], dtype=np.float64))


def tree_l2_sq_sensitivity(layers: int, relation: str) -> int:
    """The squared L2 change of a full b-ary tree's node vector (all `layers` levels, the root
    included, as OpenDP's make_b_ary_tree builds it) between neighbours: under substitution one unit
    leaves one leaf and joins another, so at most two nodes of every level but the root (which holds
    n either way) change by 1: 2 (layers - 1); under add/remove one node of every level changes by 1:
    layers. Both are attained (the first and the last leaf)."""
    return 2 * (layers - 1) if relation == "substitution" else layers


@functools.lru_cache(maxsize=None)
def opendp_zcdp_scale(size: int, rho: float, b: int, relation: str) -> float:
    """The Gaussian scale that makes OpenDP's b-ary tree + make_gaussian rho-zCDP under `relation`,
    calibrated with the tree's exact L2 sensitivity (`tree_l2_sq_sensitivity`): the measurement's
    map(d) = d^2 / (2 scale^2), so the scale is searched at d_in = 1, d_out = rho / Delta2.
    (OpenDP's own stability map for the tree, d_in * layers, is an L1 bound: chaining through it at
    d_in = 1 would calibrate to Delta^2 = layers^2, e.g. 121 instead of 20 or 11 on a 2^10 grid.)"""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int)
    tree = dp.t.make_b_ary_tree(*space, leaf_count=size, branching_factor=b)
    layers = int(tree.map(1))  # OpenDP's L2 map is d_in * layers
    delta2 = tree_l2_sq_sensitivity(layers, relation)
    lo, hi = np.zeros(size, np.int64), np.zeros(size, np.int64)
    lo[0], hi[-1] = 1, 1
    diff = np.asarray(tree(lo.tolist()), np.int64) - np.asarray(tree(hi.tolist()), np.int64)
    assert int((diff**2).sum()) == 2 * (layers - 1)  # the substitution bound, attained by OpenDP's tree
    assert int((np.asarray(tree(lo.tolist()), np.int64) ** 2).sum()) == layers  # add/remove, attained
    gauss = lambda s: dp.m.make_gaussian(tree.output_domain, tree.output_metric, s)  # noqa: E731
    scale = dp.binary_search_param(gauss, d_in=1, d_out=rho / delta2)
    assert gauss(scale).map(1) * delta2 <= rho * (1 + 1e-9)
    return float(scale)


def opendp_zcdp_prefix(hist: np.ndarray, rho: float, b: int, relation: str) -> np.ndarray:
    """OpenDP's b-ary tree with (discrete) Gaussian noise at rho-zCDP under `relation` (scale from
    `opendp_zcdp_scale`), made consistent."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int)
    size = hist.size
    tree = dp.t.make_b_ary_tree(*space, leaf_count=size, branching_factor=b)
    meas = tree >> dp.m.then_gaussian(opendp_zcdp_scale(size, rho, b, relation))
    leaves = dp.t.make_consistent_b_ary_tree(branching_factor=b)(meas([int(v) for v in hist]))
    return np.cumsum(np.asarray(leaves[:size], dtype=np.float64))


def histogram_prefix(hist: np.ndarray, eps: float, bins: int, delta: int) -> np.ndarray:
    """Sarus 'histogram': noisy counts of `bins` equal bins, cumulated, linearly interpolated."""
    size = hist.size
    width = size // bins
    counts = hist.reshape(bins, width).sum(axis=1)
    noisy = counts + secure_noise(bins, scale_fraction(delta, eps))
    ends = np.cumsum(noisy)
    x = np.arange(width - 1, size, width)
    return np.interp(np.arange(size), x, ends, left=0)


def adaptive_prefix(prefix: np.ndarray, eps: float, queries: int, total: float) -> np.ndarray:
    """Sarus 'adaptive': noisy counts below a point, each next point bisecting the widest gap in
    estimated quantile; eps split evenly over the queries; the CDF interpolated between them."""
    size = prefix.size
    known = {-1: 0.0, size - 1: total}
    scale = scale_fraction(1, eps / queries)
    for _ in range(queries):
        xs = sorted(known)
        vals = np.maximum.accumulate([known[x] for x in xs])
        gaps = [(vals[k + 1] - vals[k], xs[k], xs[k + 1]) for k in range(len(xs) - 1) if xs[k + 1] - xs[k] > 1]
        if not gaps:
            break
        _, a, b = max(gaps)
        mid = (a + b) // 2
        known[mid] = float(prefix[mid] + secure_noise(1, scale)[0])
    xs = sorted(known)
    vals = np.clip(np.maximum.accumulate([known[x] for x in xs]), 0, total)
    return np.interp(np.arange(size), xs, vals)


def quantile_error(true_prefix: np.ndarray, est, total: float, public_n: bool) -> float:
    """Mean |q - q_hat| in grid units. A `dpcdf.Release` answers with its own `quantile`; any other
    estimate is inverted at its first crossing (running maximum). Each method divides by its own
    estimate of n (its last prefix) unless n is public (substitution)."""
    q_true = np.searchsorted(true_prefix / total, PS, side="left")
    if isinstance(est, dpcdf.Release):
        q_est = est.grid.index(est.quantile(PS))
    else:
        f_est = np.maximum.accumulate(est) / (total if public_n else max(float(est[-1]), 1.0))
        q_est = np.minimum(np.searchsorted(f_est, PS, side="left"), true_prefix.size - 1)
    return float(np.mean(np.abs(q_true - q_est)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--relation", default="substitution", choices=["substitution", "add-remove"])
    ap.add_argument("--n", type=int, default=10_000, help="how many values the sparse data set has (1e3 .. 1e6)")
    ap.add_argument("--zcdp", action="store_true", help="also compare rho-zCDP releases at rho = eps^2 / 2")
    ap.add_argument("--only", choices=["paper", "skewed", "sparse"], help="one data set (e.g. sparse at another --n)")
    ap.add_argument("--bands", action="store_true", help="coverage and width of Release.confidence_band instead")
    ap.add_argument("--level", type=float, default=0.95, help="the bands' level (with --bands)")
    args = ap.parse_args()
    if args.bands:
        bands(args.runs, args.level, args.n, args.only, args.zcdp)
        return
    rel, runs = args.relation, args.runs
    d_in = 2 if rel == "substitution" else 1
    for name, (data, size) in datasets(args.n).items():
        if args.only and not name.startswith(args.only):
            continue
        grid = Grid.integers(size)
        L = int(np.log2(size))
        prefix = dpcdf.prefix_counts(data, grid)
        hist = np.bincount(data, minlength=size)
        total = float(data.size)
        print(f"\n{name}, N = {size}, relation = {rel}, {runs} runs: counts MSE (quantile error)")
        print(f"{'method':<44}" + "".join(f"{'eps=' + str(e):>22}" for e in (0.1, 0.5, 1.0)))
        rows: dict[str, list[str]] = {}
        best = {}
        for eps in (0.1, 0.5, 1.0):
            mech = dpcdf.TreeMechanism(size, eps, rel)  # ours: one tree release per run, post-processed both ways (paired)
            ours = [mech.noisy(prefix, secure_node_noise) for _ in range(runs)]
            paired = iter([finish_release(grid, mech, r, data.size, post) for r in ours] for post in ("auto", "monotone"))
            tree_rows = [next(paired), next(paired)]
            methods = {
                "paper eq. 2, scale (L+1)/eps (raw)": lambda: dpcdf.release_ecdf(
                    data, grid, eps, dpcdf.PathMechanism(size, eps, rel, calibration="paper"), rel, "none").raw,
                "  theory 2(L+1)^3/eps^2": None,
                "path, exact sensitivity (raw)": lambda: dpcdf.release_ecdf(data, grid, eps, "path", rel, "none").raw,
                "path, exact sensitivity + monotone": lambda: dpcdf.release_ecdf(data, grid, eps, "path", rel).counts,
                AUTO: [dpcdf.release_ecdf(data, grid, eps, relation=rel) for _ in range(runs)],
                TREE: tree_rows[0],
                PLAIN: tree_rows[1],
                "OpenDP b=2 + consistency": lambda: opendp_prefix(hist, eps, 2, d_in),
                "OpenDP b=16 + consistency": lambda: opendp_prefix(hist, eps, 16, d_in),
                "Sarus histogram (oracle-best bins)": None,
                "Sarus adaptive (oracle-best queries)": None,
            }
            for label, fn in methods.items():
                if label.startswith("  theory"):
                    rows.setdefault(label, []).append(f"{2 * (L + 1) ** 3 / eps**2:>22.0f}")
                    continue
                if fn is None:
                    options = [4, 8, 16, 32, 64, 128, 256, size] if "histogram" in label else [4, 8, 16, 32, 64]
                    make = (lambda k: histogram_prefix(hist, eps, k, d_in)) if "histogram" in label else (
                        lambda k: adaptive_prefix(prefix, eps, k, total))
                    trials = {k: [make(k) for _ in range(runs)] for k in options}
                    k_best = min(options, key=lambda k: np.mean([metrics.mse_counts(prefix, e) for e in trials[k]]))
                    ests = trials[k_best]
                elif isinstance(fn, list):  # ours, made above
                    ests = fn
                else:
                    ests = [fn() for _ in range(runs)]
                mse = float(np.mean([metrics.mse_counts(prefix, getattr(e, "counts", e)) for e in ests]))
                qe = float(np.mean([quantile_error(prefix, e, total, rel == "substitution") for e in ests]))
                rows.setdefault(label, []).append(f"{mse:>14.0f} ({qe:>5.1f})")
                best.setdefault(eps, {})[label] = mse
        for label, cells in rows.items():
            print(f"{label:<44}" + "".join(cells))
        for eps, b in best.items():
            opendp_best = min(b["OpenDP b=2 + consistency"], b["OpenDP b=16 + consistency"])
            ratio = b[AUTO] / opendp_best
            sarus = b["Sarus adaptive (oracle-best queries)"]
            print(f"eps={eps}: ours / OpenDP's best = {ratio:.2f} (goal <= 0.75); / Sarus adaptive: ours "
                  f"{b[AUTO] / sarus:.2f}, the tree {b[TREE] / sarus:.2f} (goal <= 1)")
        if args.zcdp:
            zcdp_block(data, grid, prefix, hist, total, rel, runs)


def zcdp_block(data, grid, prefix, hist, total, rel, runs) -> None:
    """rho-zCDP rows, and per rho the ratio of our default to OpenDP's b = 2 tree and to OpenDP's tree
    at its default branching (`choose_branching_factor`, made for Laplace noise)."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    b_default = int(dp.t.choose_branching_factor(hist.size))
    rhos = (0.005, 0.125, 0.5)  # eps^2 / 2 for eps = 0.1, 0.5, 1
    print("zCDP, same data and relation: counts MSE (quantile error)")
    print(f"{'method':<44}" + "".join(f"{'rho=' + str(r):>22}" for r in rhos))
    ours = "ours zCDP: square-root factorization (default)"
    rows = {ours: lambda r: dpcdf.release_ecdf(data, grid, privacy="zcdp", rho=r, relation=rel),
            "ours zCDP: discrete Gaussian b=2 tree": lambda r: dpcdf.release_ecdf(data, grid, privacy="zcdp", rho=r, relation=rel, mechanism="tree"),
            "OpenDP zCDP b=2 + consistency": lambda r: opendp_zcdp_prefix(hist, r, 2, rel),
            f"OpenDP zCDP b={b_default} (its default) + consistency": lambda r: opendp_zcdp_prefix(hist, r, b_default, rel)}
    mses: dict[str, list[float]] = {}
    for label, fn in rows.items():
        cells = []
        for r in rhos:
            ests = [fn(r) for _ in range(runs)]
            mse = float(np.mean([metrics.mse_counts(prefix, getattr(e, "counts", e)) for e in ests]))
            qe = float(np.mean([quantile_error(prefix, e, total, rel == "substitution") for e in ests]))
            cells.append(f"{mse:>14.0f} ({qe:>5.1f})")
            mses.setdefault(label, []).append(mse)
        print(f"{label:<44}" + "".join(cells))
    b2, bd = mses["OpenDP zCDP b=2 + consistency"], mses[f"OpenDP zCDP b={b_default} (its default) + consistency"]
    for k, r in enumerate(rhos):
        print(f"rho={r}: ours / OpenDP b=2 = {mses[ours][k] / b2[k]:.2f} (goal <= 0.75); "
              f"/ OpenDP b={b_default} = {mses[ours][k] / bd[k]:.2f} (goal <= 0.5)")

def shapes(n: int, size: int) -> dict[str, np.ndarray]:
    """The three data shapes redrawn with n values on a grid of `size` points (the band's width goal)."""
    rng = np.random.default_rng(11)  # data only
    paper = rng.integers(0, size, n)  # Poisson(n / size) counts per grid point: n uniform grid points
    skewed = np.minimum(rng.exponential(25 * size / N, n).astype(np.int64), size - 1)
    centres = (np.array([300, 310, 1800, 2600, 3900]) * size) // SPARSE_N
    sparse = np.clip(np.rint(rng.normal(centres[rng.integers(0, 5, n)], 2)), 0, size - 1).astype(np.int64)
    return {"paper": paper, "skewed": skewed, "sparse": sparse}


def band_cells(data, grid, relation, runs, level, **release) -> tuple[float, float]:
    """(coverage, mean width) of `runs` releases' bands at `level`."""
    truth = dpcdf.prefix_counts(data, grid) / data.size
    hits, widths = 0, []
    for _ in range(runs):
        lo, hi = dpcdf.release_ecdf(data, grid, relation=relation, **release).confidence_band(level)
        hits += bool(np.all((lo <= truth + 1e-12) & (truth <= hi + 1e-12)))
        widths.append(float(np.mean(hi - lo)))
    return hits / runs, float(np.mean(widths))


def bands(runs: int, level: float, n_sparse: int, only: str | None, zcdp: bool) -> None:
    """--bands: coverage of the data's ECDF and mean width of `Release.confidence_band`. The headers
    are the accuracy tables' (method, then one column per eps or rho); a cell is coverage, width."""
    epsilons, rhos = (0.1, 0.5, 1.0), (0.005, 0.125, 0.5)
    print(f"confidence bands at level {level}, {runs} releases per cell: coverage of the data's ECDF at every "
          "threshold, mean width in F")
    print(f"{'method':<44}" + "".join(f"{'eps=' + str(e):>22}" for e in epsilons))
    worst, rows, pooled = 1.0, [], []
    for relation in ("substitution", "add-remove"):
        for name, (data, size) in datasets(n_sparse).items():
            short = name.split()[0].rstrip(":")
            if only and short != only:
                continue
            grid = Grid.integers(size)
            for mechanism in ("auto", "tree"):
                cells = [band_cells(data, grid, relation, runs, level, epsilon=e, mechanism=mechanism) for e in epsilons]
                worst, pooled = min(worst, *(c for c, _ in cells)), pooled + [c for c, _ in cells]
                print(f"{relation + ' ' + short + ' ' + mechanism:<44}" + "".join(f"{c:>13.0%} {w:>8.4f}" for c, w in cells))
            rows.append((relation, short, data, grid))
    if zcdp:
        print(f"{'method':<44}" + "".join(f"{'rho=' + str(r):>22}" for r in rhos))
        for relation, short, data, grid in rows:
            for mechanism, label in (("auto", "zcdp default"), ("tree", "zcdp tree")):
                cells = [band_cells(data, grid, relation, runs, level, privacy="zcdp", rho=r, mechanism=mechanism) for r in rhos]
                worst, pooled = min(worst, *(c for c, _ in cells)), pooled + [c for c, _ in cells]
                print(f"{relation + ' ' + short + ' ' + label:<44}" + "".join(f"{c:>13.0%} {w:>8.4f}" for c, w in cells))
    below = sum(c < 0.93 for c in pooled)
    sd = np.sqrt(level * (1 - level) / (runs * len(pooled)))
    print(f"lowest coverage {worst:.0%} (goal >= 93% at level 0.95); {below} of {len(pooled)} cells below 93%; pooled "
          f"{np.mean(pooled):.1%} of {runs * len(pooled)} releases (a correct band: >= {level:.0%} - 3 sd = {level - 3 * sd:.1%})")
    print(f"width at eps=1, n = 5000, N = {N}, each shape redrawn: mean width in F (coverage), {runs} releases")
    widest = 0.0
    for relation in ("substitution", "add-remove"):
        for short, data in shapes(5000, N).items():
            if only and short != only:
                continue
            cells = []
            for mechanism in ("auto", "tree"):
                c, w = band_cells(data, Grid.integers(N), relation, runs, level, epsilon=1.0, mechanism=mechanism)
                widest = max(widest, w) if mechanism == "auto" else widest
                cells.append(f"{mechanism} {w:.4f} ({c:.0%})")
            print((relation + " " + short).ljust(24) + "   ".join(cells))
    print(f"widest default band {widest:.4f} (goal <= 0.05)")

if __name__ == "__main__":
    main()
