"""The default release against our tree, OpenDP's b-ary tree at its best b, on real data and over n.

    python bench/accuracy_sweep.py --real [--runs 20] [--sizes full,10000] [--eps 0.1,0.5,1] [--dawa]
    python bench/accuracy_sweep.py --sweep [--runs 20] [--ns 1e3,1e4,1e5,1e6,1e7] [--dawa]

--real: the nine DPBench histograms in ../shared/data/dpbench/ (or --data DIR), 4,096 bins each, at full
size and at subsamples drawn without replacement; --sweep: synthetic shapes on 2^12 at each n (smooth,
heavy-tailed, integer values on a finer grid, zero-inflated, gaps, a comb, spikes 1 to 50 points wide).
Each cell (data, n, relation, eps) runs `--runs` releases of each method; counts MSE over all 4,096
prefixes, and the quantile error in grid units (p = 0.01 .. 0.99). Methods: ours, the default
(`mechanism="auto"`), plan version 5 with --v5 and any earlier version V with --prev V (paired with the
default: `default/vV` lines in the distribution), the b-ary tree (`"tree"`), each
released centrally, in each run from one fresh secret key: common random numbers (`coupled_noise`), so
that a node that two methods release gets the same uniforms in both, at any scale (the default's whole
tree at 0.98 eps is then the tree's noise times about 1 / 0.98, not an independent draw whose 20-run
mean MSE differs from the tree's by 10 to 40% on its own) and the runs' ratios are paired, while each
method's noise law is exactly its own (DLap by inverse CDF: what a server's exact sampler draws); OpenDP's make_b_ary_tree + then_laplace + consistency at
b = 2, 4, 8, 16, 32, of which each cell reports the best (an oracle choice, which favours it). With
--dawa, also DAWA (bench/dawa.py: Li, Hay, Miklau, Wang, VLDB 2014, its partition as the authors' code
runs it, a b-ary tree over its buckets in place of GreedyH; its own fresh noise, so not paired).

Printed: one row per cell (ratios of mean MSE, with the standard error of the default's log ratio to
the tree from the runs), then per relation and eps the distribution over cells (geometric mean, median,
worst) of default / tree and default / OpenDP's best, and how many cells meet the goals of issue 41.
With --dawa each row ends with default / DAWA and DAWA's quantile error (the header row stays the one
without it, which the docs' checker matches), and each line of the distribution is followed by one for
default / DAWA: geometric mean, median, worst, the cells where the default's MSE is at most DAWA's, and
those where its quantile error is at most DAWA's + 0.5.
"""
from __future__ import annotations

import argparse
import functools
import math
import secrets
from pathlib import Path

import numpy as np

import dpcdf
from dpcdf import Grid, metrics
from dpcdf.release.adaptive import AdaptiveMechanism
from dpcdf.release.ecdf import finish_release
from Crypto.Cipher import AES

SIZE = 4096
PS = np.linspace(0.01, 0.99, 99)
BS = (2, 4, 8, 16, 32)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "dpbench"


def real_sets(folder: Path, sizes: list[str], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """{name@n: histogram}: each DPBench set at full size and at subsamples (without replacement)."""
    out = {}
    for path in sorted(folder.glob("*.npy")):
        hist = np.load(path).astype(np.int64)
        name = path.name.split(".")[0][:14]
        for s in sizes:
            if s == "full":
                out[f"{name}@full"] = hist
            elif int(s) < hist.sum():
                out[f"{name}@{int(s):.0e}"] = rng.multivariate_hypergeometric(hist, int(s))
    return out


def shapes(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Synthetic histograms of n values on 2^12 points (data only: numpy's generator is fine here)."""
    x = np.arange(SIZE)

    def draw(p):
        return rng.multinomial(n, p / p.sum())
    normal = np.exp(-0.5 * ((x - 2000) / 300) ** 2)
    lognormal = np.exp(-0.5 * ((np.log(x + 1) - 5) / 0.9) ** 2) / (x + 1)
    integers = np.where(x % 14 == 0, np.exp(-0.5 * ((x - 1500) / 250) ** 2), 0.0)  # 0.28-spaced grid, integer ages
    zeros = 0.5 * normal / normal.sum() + np.where(x == 0, 0.5, 0.0)
    gaps = np.where((x // 512) % 2 == 0, 1.0, 0.0) * (1 + 0.5 * np.sin(x / 60))
    comb = np.where(x % 64 == 0, 1.0, 0.0)
    spikes = {w: sum(np.where(abs(x - c) < w / 2 + 0.5, 1.0, 0.0) for c in (300, 1290, 2600, 3900)) for w in (1, 8, 50)}
    out = {"normal": normal, "lognormal": lognormal, "integers": integers, "zero-inflated": zeros, "gaps": gaps,
           "comb": comb}
    out.update({f"spikes w={w}": p for w, p in spikes.items()})
    return {f"{k}@{n:.0e}": draw(p) for k, p in out.items()}


@functools.lru_cache(maxsize=None)
def opendp_measure(b: int, eps: float, d_in: int):
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int)
    tree = dp.t.make_b_ary_tree(*space, leaf_count=SIZE, branching_factor=b)
    meas = dp.binary_search_chain(lambda s: tree >> dp.m.then_laplace(s), d_in=d_in, d_out=eps)
    return meas, dp.t.make_consistent_b_ary_tree(branching_factor=b)


def opendp_prefix(hist: np.ndarray, eps: float, b: int, d_in: int) -> np.ndarray:
    meas, consistent = opendp_measure(b, eps, d_in)
    return np.cumsum(np.asarray(consistent(meas(hist.tolist()))[:SIZE], dtype=np.float64))


def quantile_error(prefix: np.ndarray, est) -> float:
    total = float(prefix[-1])
    truth = np.searchsorted(prefix / total, PS, side="left")
    if isinstance(est, dpcdf.Release):
        return float(np.mean(np.abs(truth - est.grid.index(est.quantile(PS)))))
    f = np.maximum.accumulate(est) / max(float(est[-1]), 1.0)
    return float(np.mean(np.abs(truth - np.minimum(np.searchsorted(f, PS, side="left"), SIZE - 1))))


def coupled_noise(key: bytes, ids: np.ndarray, scale) -> np.ndarray:
    """DLap(scale) for each id, G1 - G2 with G = floor(-scale ln U) geometric (P(G >= k) = e^(-k / scale)),
    U two uniforms per id from AES_key(id): the same id gives the same uniforms at every scale, so the
    noise is monotone in the scale (common random numbers across scales, bench only: the servers' own
    sampler, `prf_noise`, is exact in integers and draws independently at each scale)."""
    ids = np.asarray(ids, np.uint64).reshape(-1)
    blocks = np.zeros((ids.size, 2), np.uint64)
    blocks[:, 0] = ids
    words = np.frombuffer(AES.new(key, AES.MODE_ECB).encrypt(blocks.astype("<u8").tobytes()), "<u8").reshape(-1, 2)
    u = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    g = np.floor(-float(scale) * np.log(u)).astype(np.int64)
    return g[:, 0] - g[:, 1]


def ours(prefix: np.ndarray, mech, grid: Grid, key: bytes) -> dpcdf.Release:
    return finish_release(grid, mech, mech.noisy(prefix, lambda ids, scale: coupled_noise(key, ids, scale)), int(prefix[-1]))


def cell(hist: np.ndarray, eps: float, rel: str, runs: int, v5: bool,
         dawa: bool = False, prev: int | None = None) -> dict[str, tuple[np.ndarray, float]]:
    """{method: (per-run MSEs, mean quantile error)}."""
    grid = Grid.integers(SIZE)
    prefix = np.cumsum(hist)
    mechs = {"default": dpcdf.release.ecdf._mechanism("auto", SIZE, eps, rel), "tree": dpcdf.TreeMechanism(SIZE, eps, rel)}
    if v5:
        mechs["v5"] = AdaptiveMechanism(SIZE, eps, rel, plan_version=5, share_rule=2)
    if prev:
        mechs["prev"] = AdaptiveMechanism(SIZE, eps, rel, plan_version=prev, share_rule=2)
    out = {}
    keys = [secrets.token_bytes(16) for _ in range(runs)]  # one PRF key per run, shared by our methods
    for label, mech in mechs.items():
        rels = [ours(prefix, mech, grid, key) for key in keys]
        out[label] = (np.array([metrics.mse_counts(prefix, r.counts) for r in rels]),
                      float(np.mean([quantile_error(prefix, r) for r in rels])))
        if label == "default":  # how often the default's plan was a histogram
            out["histograms"] = float(np.mean([getattr(r.released, "plan", None) is not None and r.released.plan.design == "bins"
                                               for r in rels]))
    d_in = 2 if rel == "substitution" else 1
    best = None
    for b in BS:
        ests = [opendp_prefix(hist, eps, b, d_in) for _ in range(runs)]
        mse = np.array([metrics.mse_counts(prefix, e) for e in ests])
        if best is None or mse.mean() < best[0].mean():
            best = (mse, float(np.mean([quantile_error(prefix, e) for e in ests])), b)
    out["opendp"] = best[:2]
    out["opendp_b"] = best[2]
    if dawa:
        from dawa import dawa_prefix  # bench/dawa.py, beside this script

        ests = [dawa_prefix(hist, eps, rel) for _ in range(runs)]
        out["dawa"] = (np.array([metrics.mse_counts(prefix, e) for e in ests]),
                       float(np.mean([quantile_error(prefix, e) for e in ests])))
    return out


def report(cells: dict, label: str, prev: int | None = None) -> None:
    """The distribution over cells, per relation and eps; `>1.1x at 2 se`: the cells whose mean log ratio
    to the tree is above log 1.1 by more than two of its standard errors (not noise at these runs)."""
    print(f"\n{label}: distribution over cells (ratios of mean counts MSE)")
    print(f"{'relation':<13}{'eps':>5}{'cells':>6}  {'default/tree: gmean median worst':>34}  {'default/OpenDP: gmean median worst':>36}  {'<=1.1x tree':>11}  {'>1.1x at 2 se':>13}  {'q <= OpenDP+0.5':>15}")  # noqa: E501 (one header, one line)
    for rel in ("substitution", "add-remove"):
        for eps in sorted({k[2] for k in cells}):
            got = [v for k, v in cells.items() if k[1] == rel and k[2] == eps]
            if not got:
                continue
            vs_tree = np.array([v["default"][0].mean() / v["tree"][0].mean() for v in got])
            vs_dp = np.array([v["default"][0].mean() / v["opendp"][0].mean() for v in got])
            q_ok = sum(v["default"][1] <= v["opendp"][1] + 0.5 for v in got)
            above = sum(v["log_ratio"] - 2 * v["se"] > math.log(1.1) for v in got)
            print(f"{rel:<13}{eps:>5}{len(got):>6}  {gmean(vs_tree):>12.3f} {np.median(vs_tree):>8.3f} {vs_tree.max():>10.3f}  "
                  f"{gmean(vs_dp):>14.3f} {np.median(vs_dp):>8.3f} {vs_dp.max():>10.3f}  "
                  f"{int((vs_tree <= 1.1).sum()):>5}/{len(got):<5}  {above:>7}/{len(got):<5}  {q_ok:>8}/{len(got)}")
            if all("prev" in v for v in got):
                vs_prev = np.array([v["default"][0].mean() / v["prev"][0].mean() for v in got])
                print(" " * 24 + f"default/v{prev}: gmean {gmean(vs_prev):.3f} median {np.median(vs_prev):.3f} worst "
                      f"{vs_prev.max():.3f} best {vs_prev.min():.3f}; v{prev}/tree worst "
                      f"{max(v['prev'][0].mean() / v['tree'][0].mean() for v in got):.3f}")
            if all("dawa" in v for v in got):
                vs_dawa = np.array([v["default"][0].mean() / v["dawa"][0].mean() for v in got])
                q_dawa = sum(v["default"][1] <= v["dawa"][1] + 0.5 for v in got)
                print(" " * 24 + f"default/DAWA: gmean {gmean(vs_dawa):.3f} median {np.median(vs_dawa):.3f} worst "
                      f"{vs_dawa.max():.3f}; default <= DAWA in {int((vs_dawa <= 1).sum())}/{len(got)} cells; "
                      f"q <= DAWA+0.5 in {q_dawa}/{len(got)}")


def gmean(x: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(x))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--sizes", default="full,10000")
    ap.add_argument("--ns", default="1e3,1e4,1e5,1e6,1e7")
    ap.add_argument("--eps", default="0.1,0.5,1")
    ap.add_argument("--relations", default="substitution,add-remove")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--only", default="", help="only data sets whose name contains this")
    ap.add_argument("--v5", action="store_true", help="also the previous default (plan version 5, share rule 2)")
    ap.add_argument("--dawa", action="store_true", help="also DAWA (bench/dawa.py): default/DAWA, its quantile error")
    ap.add_argument("--prev", type=int, help="also this plan version (paired with the default): its /tree at each row's end")
    args = ap.parse_args()
    rng = np.random.default_rng(2026)  # data only (subsamples, synthetic draws)
    sets = {}
    if args.real:
        sets.update(real_sets(args.data, args.sizes.split(","), rng))
    if args.sweep:
        for n in args.ns.split(","):
            sets.update(shapes(int(float(n)), rng))
    sets = {k: v for k, v in sets.items() if args.only in k}
    epss = [float(e) for e in args.eps.split(",")]
    print(f"{args.runs} runs a cell, grid 2^12; ratios of mean counts MSE; +-: standard error of the mean log ratio")
    if args.dawa:
        print("--dawa: each row ends with default/DAWA (ratio of mean counts MSE) and DAWA's quantile error")
    if args.prev:
        print(f"--prev {args.prev}: each row ends with v{args.prev}/tree (plan version {args.prev}, the same keys as the default)")
    print(f"{'data@n':<26}{'relation':<13}{'eps':>5}{'default/tree':>16}{'def/OpenDP':>11}{'tree/OpenDP':>12}{'v5/tree':>9}{'hist':>6}{'q: def, tree, OpenDP (b)':>30}")  # noqa: E501
    cells = {}
    for name, hist in sets.items():
        for rel in args.relations.split(","):
            for eps in epss:
                c = cell(hist, eps, rel, args.runs, args.v5, args.dawa, args.prev)
                cells[(name, rel, eps)] = c
                d, t, o = c["default"], c["tree"], c["opendp"]
                se = float(np.std(np.log(d[0]) - np.log(t[0])) / math.sqrt(args.runs))
                c["se"], c["log_ratio"] = se, float(np.mean(np.log(d[0]) - np.log(t[0])))
                v5 = f"{c['v5'][0].mean() / t[0].mean():>9.3f}" if args.v5 else f"{'-':>9}"
                print(f"{name:<26}{rel:<13}{eps:>5}{d[0].mean() / t[0].mean():>10.3f} +-{se:.2f}"
                      f"{d[0].mean() / o[0].mean():>11.3f}{t[0].mean() / o[0].mean():>12.3f}{v5}{c['histograms']:>6.0%}"
                      f"{d[1]:>10.2f} {t[1]:>6.2f} {o[1]:>6.2f} ({c['opendp_b']})"
                      + (f"{d[0].mean() / c['dawa'][0].mean():>10.3f} {c['dawa'][1]:>6.2f}" if args.dawa else "")
                      + (f"{c['prev'][0].mean() / t[0].mean():>9.3f}" if args.prev else ""),
                      flush=True)
    report(cells, "real data" if args.real and not args.sweep else "all cells", args.prev)


if __name__ == "__main__":
    main()
