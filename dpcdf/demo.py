"""`dpcdf demo`: two real servers on loopback, a few thousand simulated clients, an analyst; prints
the true and DP ECDF and quantiles with the error metrics, writes a plot, shuts everything down."""
from __future__ import annotations

import tempfile
import time

import numpy as np

from .analyst import Analyst
from .errors import ParameterError
from .release import metrics
from .release.ecdf import prefix_counts
from .service.client import create_task, submit
from .service.processes import start_server, stop


MIN_CLIENTS = 10  # two simulated groups of at least 5 each; the task's minimum batch is min(100, clients)


def run_demo(clients: int = 3000, epsilon: float = 1.0, mechanism: str = "adaptive", plot: str | None = "dpcdf_demo.png",
             warm: bool = True) -> dict:
    """`warm`: compile (or load) the kernels first, with progress lines (`dpcdf warm-up`), so that
    neither the servers nor the analyst wait silently for the compiler."""
    if clients < MIN_CLIENTS:
        raise ParameterError(f"the demo needs at least {MIN_CLIENTS} clients, got {clients}")
    if warm:
        from .warmup import warm_up

        warm_up(progress=True)
    rng = np.random.default_rng(2024)  # the simulated population, not privacy noise
    values = np.concatenate([rng.normal(35, 8, clients // 2), rng.gamma(6, 8, clients - clients // 2)]).clip(0, 100)
    grid_spec = {"kind": "uniform", "lo": 0.0, "hi": 100.0, "bits": 10}
    with tempfile.TemporaryDirectory(prefix="dpcdf-demo-") as tmp:
        procs = []
        try:
            print("starting two servers on loopback (each loads its kernels) ...", flush=True)
            for party in (0, 1):
                procs.append(start_server(party, f"{tmp}/server{party}"))
            urls = [url for _, url in procs]
            print(f"servers up: {urls[0]} (party 0), {urls[1]} (party 1)")
            config, token = create_task(urls, grid_spec, epsilon, mechanism, "substitution", min_batch=min(100, clients))
            print(f"task {config.task_id}: grid of {config.make_grid().size} thresholds on [0, 100], epsilon {epsilon}, {mechanism} mechanism")
            t1 = time.perf_counter()
            res = submit(config, values, batch=500, progress=True, spool=f"{tmp}/clients.spool")
            t2 = time.perf_counter()
            print(f"{res['complete']} reports acknowledged by both servers in {t2 - t1:.1f} s "
                  f"({res['complete'] / (t2 - t1):.0f} reports/s, sealing and spooling included)")
            analyst = Analyst(config, token)
            print("closing the collection: the servers agree on one report set" +
                  (" and check every report" if config.verify else ""), flush=True)
            analyst.close()
            t3 = time.perf_counter()
            if analyst.rejected is not None:
                print(f"close: the servers checked all {res['complete']} reports in {t3 - t2:.2f} s, excluded "
                      f"{sum(analyst.rejected.values())} (docs/verification.md)")
            rel = analyst.release()
            t4 = time.perf_counter()
            print(f"analyst: full-grid release in {t4 - t3:.2f} s\n")
        finally:
            for proc, _ in procs:
                stop(proc)
    grid = config.make_grid()
    truth = prefix_counts(values, grid) / values.size
    dp_cdf = rel.cdf()
    print(f"{'t':>6} {'true F(t)':>10} {'DP F(t)':>10}")
    for t in (10, 20, 30, 40, 50, 60, 70, 80, 90):
        i = grid.index([t])[0]
        print(f"{t:>6} {truth[i]:>10.4f} {dp_cdf[i]:>10.4f}")
    ps = [0.1, 0.25, 0.5, 0.75, 0.9]
    true_q = grid.thresholds[np.searchsorted(truth, ps, side="left")]
    print(f"\n{'p':>6} {'true q(p)':>10} {'DP q(p)':>10}")
    for p, a, b in zip(ps, true_q, rel.quantile(ps)):
        print(f"{p:>6} {a:>10.2f} {b:>10.2f}")
    m = {"KS": metrics.ks(truth, dp_cdf), "Wasserstein-1": metrics.wasserstein1(truth, dp_cdf, grid.thresholds),
         "energy": metrics.energy(truth, dp_cdf, grid.thresholds)}
    print("\n" + ", ".join(f"{k} {v:.4f}" for k, v in m.items()))
    print(f"privacy: {rel.statement}; each server adds its own full noise, so this holds even if the analyst colludes with one server")
    if plot:
        try:
            import matplotlib
        except ImportError:
            print("(no plot: matplotlib is not installed; pip install 'fss-dpcdf[demo]')")
            return {"metrics": m, "release": rel, "truth": truth}

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ax = plt.figure(figsize=(6, 4)).add_subplot()
        ax.step(grid.thresholds, truth, where="post", label="true ECDF", color="black", lw=0.8)
        rel.plot(ax, band=0.95, label=f"DP ECDF (two servers, eps={epsilon})")  # with its 95% simultaneous band
        ax.set_xlabel("value")
        ax.set_ylabel("F")
        plt.tight_layout()
        plt.savefig(plot, dpi=120)
        plt.close()
        print(f"plot: {plot}")
    return {"metrics": m, "release": rel, "truth": truth}
