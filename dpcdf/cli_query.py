"""`dpcdf query`: the analyst's answers, printed (F(t) with the threshold it read and its band as an
interval, quantiles, the ROC curve or the Hosmer-Lemeshow statistic), as one JSON object (`--json`), or
kept: the whole release as CSV (`--csv FILE`) and drawn with its band (`--plot FILE`). Every number is
the Python API's (`dpcdf.Analyst.from_task_file(TASK).release()`); all of it post-processing."""
from __future__ import annotations

import csv
import json
import math
import os
import sys
import threading
from pathlib import Path

from .cli_inputs import CliError


def analyst_from_args(args):
    """The analyst of --task (and --token-file)."""
    from .analyst import Analyst

    return Analyst.from_task_file(args.task, args.token_file)


PROGRESS_AFTER, PROGRESS_EVERY = 3.0, 2.0  # seconds: a close that takes longer shows the check's progress


def close_with_progress(analyst) -> int | None:
    """`analyst.close()`; for a verified task whose close is still checking reports after a few seconds,
    a line on stderr as server 0's check progresses ("checking: 12,000 of 50,000 reports"), from GET
    /tasks/{id} (the analyst's own status; not under add/remove, where n is private)."""
    if not analyst.config.verify:
        return analyst.close()
    done: dict = {}

    def close() -> None:
        try:
            done["n"] = analyst.close()
        except BaseException as exc:  # noqa: BLE001 (raised again below, in the caller's thread)
            done["error"] = exc

    worker = threading.Thread(target=close, daemon=True)
    worker.start()
    worker.join(PROGRESS_AFTER)
    shown = None
    while worker.is_alive():
        try:
            st = analyst.status(0)
        except Exception:  # noqa: BLE001 (progress is a courtesy: the close's own answer decides)
            st = {}
        share, n = st.get("checked"), st.get("reports")
        if share is not None and n and share != shown:
            print(f"checking: {round(share * n):,} of {n:,} reports", file=sys.stderr, flush=True)
            shown = share
        worker.join(PROGRESS_EVERY)
    if "error" in done:
        raise done["error"]
    return done["n"]


def cmd_status(args) -> None:
    """The analyst's view of a task: what it is, and each server's count and state (or why it did not answer)."""
    from .service.http import ServerError

    analyst = analyst_from_args(args)
    c = analyst.config
    budget = f"epsilon {c.epsilon:g}" if c.privacy == "pure" else f"rho {c.rho:g}"
    print(f"task {c.task_id}" + (f" ({c.name})" if c.name else "") + f": {c.payload} task, {c.mechanism} mechanism, "
          f"{budget} under {c.relation}, {analyst.grid.size}-point grid, {'verified' if c.verify else 'unverified'} reports")
    answered = 0
    for party, url in enumerate(c.servers):
        try:
            st = analyst.status(party)
        except (ServerError, OSError) as exc:
            print(f"server {party} ({url}): no answer ({exc})")
            continue
        answered += 1
        reports = "the count stays private (add/remove)" if st["reports"] is None else f"{st['reports']} reports"
        state = "closed" if st["closed"] else f"collecting (queries from {st['min_batch']} reports)"
        restored = f"; restored from a backup ({st['restored']})" if st.get("restored") else ""
        print(f"server {party} ({url}): {state}, {reports}{restored}")
    if answered < 2:
        raise CliError(f"{2 - answered} of the two servers did not answer: the task can be neither closed nor queried now")


def _writable(flag: str, path: str | None) -> None:
    """Refuses an output file that cannot be written, before the query (which may close the collection)."""
    if path is None:
        return
    where = Path(path).resolve().parent
    if Path(path).is_dir() or not where.is_dir() or not os.access(where, os.W_OK):
        raise CliError(f"--{flag}: cannot write {path} ({where} is not a writable directory, or {path} is one)")


def _check_args(args) -> None:
    """What the command line alone can get wrong, before any file is read."""
    for t in args.ecdf:
        if not math.isfinite(t):
            raise CliError(f"--ecdf: {t} is not a finite number")
    for p_ in args.quantiles:  # before anything closes (nan fails the comparison too)
        if not 0 <= p_ <= 1:
            raise CliError(f"--quantiles: a level is a number in [0, 1], got {p_}")
    _writable("csv", args.csv)
    _writable("plot", args.plot)


def _check(args, config, mech) -> None:
    """What the task makes wrong, before the query (which may close the collection)."""
    if args.bisect and not mech.answers_prefixes:
        raise CliError(f"--bisect asks prefix queries (Algorithm 1), which this task's {mech.name} mechanism does not "
                       "answer; run the same query without --bisect (its full-grid release answers every threshold and "
                       "quantile)")
    if args.bisect and (args.csv or args.plot):
        raise CliError("--csv and --plot keep the whole release; --bisect answers single prefixes: ask without --bisect")
    if args.json and (args.roc or args.hosmer_lemeshow is not None):
        raise CliError("--json prints ECDF values and quantiles; ask --roc and --hosmer-lemeshow without it")
    if args.hosmer_lemeshow is not None and (args.csv or args.plot):
        raise CliError("--csv and --plot keep an ECDF or a ROC curve; --hosmer-lemeshow prints one statistic")
    if args.roc or args.hosmer_lemeshow is not None:
        want = "label" if args.roc else "calibration"
        if not (config.payload.roc if args.roc else config.payload.scored):
            raise CliError(f"--{'roc' if args.roc else 'hosmer-lemeshow'} needs a {want} task (dpcdf task --payload "
                           f"{want}); this task's payload is {config.payload}")
    elif config.payload.roc:
        raise CliError("this is a label task: it releases a ROC curve; ask with dpcdf query --roc")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install 'fss-dpcdf[demo]' (--csv keeps the same numbers)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def cmd_query(args) -> None:
    _check_args(args)
    analyst = analyst_from_args(args)
    config, mech = analyst.config, analyst.mechanism
    _check(args, config, mech)
    if not analyst.closed_on_servers():  # closed first, and said once done (a refused close leaves it open)
        close_with_progress(analyst)
        print("note: this first query closed the collection on both servers: later uploads to this task are refused "
              "(dpcdf close does only that)", file=sys.stderr)
    if args.roc:
        return _roc(args, analyst)
    if args.hosmer_lemeshow is not None:
        hl = analyst.hosmer_lemeshow(args.hosmer_lemeshow)
        aware = getattr(hl, "noise_aware_p_value", None)  # the raw p ignores the noise in H (too small): it goes last
        print(f"Hosmer-Lemeshow H = {hl.statistic:.3f}, " + (f"noise-aware p = {aware:.4f} (p = {hl.p_value:.4f} if H had no "
              "noise)" if aware is not None else f"p = {hl.p_value:.4f}"))
        print(hl.statement)  # the ECDF's and the group sums' guarantee together
        return
    source = analyst if args.bisect else analyst.release(args.postprocess)
    band = None if args.bisect or not args.ecdf else source.confidence_band(0.95, ts=args.ecdf)  # post-processing
    read = [float(r) for r in source.read_at(args.ecdf)] if hasattr(source, "read_at") else list(args.ecdf)
    _keep_ecdf(args, source)
    if args.json:  # the same numbers as the Python API's (`dpcdf.Analyst(...).release()`), for a program to keep
        ecdf = [{"t": t_, "F": float(f_), "read_at": read[k] if math.isfinite(read[k]) else None}
                | ({} if band is None else {"band95": [float(band[0][k]), float(band[1][k])]})
                for k, (t_, f_) in enumerate(zip(args.ecdf, source.ecdf(args.ecdf)))]
        quantiles = [{"p": p_, "q": float(q_)} for p_, q_ in zip(args.quantiles, source.quantile(args.quantiles))]
        print(json.dumps({"task_id": config.task_id, "ecdf": ecdf, "quantiles": quantiles,
                          "statement": analyst.mechanism.statement(), "rejected": analyst.rejected}))
        return
    for k, (t_, f_) in enumerate(zip(args.ecdf, source.ecdf(args.ecdf))):
        at = "" if read[k] == t_ else (f" (read at the threshold {read[k]:g}: values in ({read[k]:g}, {t_:g}] count at the next one)"
                                        if math.isfinite(read[k]) else " (below the grid's first threshold)")
        print(f"F({t_:g}) = {f_:.4f}{at}" + ("" if band is None else f"; 95% simultaneous band {band[0][k]:.4f} to {band[1][k]:.4f}"))
    for p_, q_ in zip(args.quantiles, source.quantile(args.quantiles)):
        print(f"q({p_:g}) = {q_:g}")
    print(analyst.mechanism.statement())
    if analyst.rejected is not None:
        print(f"verified: the servers checked every report; excluded {sum(analyst.rejected.values())}"
              + "".join(f", {k} {v}" for k, v in sorted(analyst.rejected.items())))


def _keep_ecdf(args, rel) -> None:
    """--csv: threshold, F, its 95% simultaneous band; --plot: the ECDF with that band."""
    if args.csv:
        lo, hi = rel.confidence_band(0.95)
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["threshold", "F", "band95_lower", "band95_upper"])
            for row in zip(rel.grid.thresholds, rel.cdf(), lo, hi):
                w.writerow([repr(float(x)) for x in row])
        print(f"csv: {args.csv}", file=sys.stderr)
    if args.plot:
        plt = _pyplot()
        ax = rel.plot(band=0.95, label="DP ECDF (two servers)")
        ax.set_title(f"task {rel.grid.size}-point grid: {rel.statement}"[:90], fontsize=8)
        ax.figure.tight_layout()
        ax.figure.savefig(args.plot, dpi=120)
        plt.close(ax.figure)
        print(f"plot: {args.plot}", file=sys.stderr)


def _roc(args, analyst) -> None:
    import numpy as np

    roc = analyst.roc()
    f_lo, f_hi, t_lo, t_hi = roc.band(0.95)
    print(f"AUC = {roc.auc:.4f}")
    fpr, tpr = np.asarray(roc.fpr, float), np.asarray(roc.tpr, float)
    for at in np.linspace(0, 1, 11):  # the released points nearest FPR 0, 0.1, ..., 1, each with its box
        k = int(np.argmin(np.abs(fpr - at)))
        print(f"FPR {fpr[k]:.3f} ({f_lo[k]:.3f} to {f_hi[k]:.3f})  TPR {tpr[k]:.4f} ({t_lo[k]:.4f} to {t_hi[k]:.4f})")
    print("(in brackets: 95% simultaneous bands, both curves at once)")
    print(roc.statement)  # both curves' guarantee (one curve's mechanism states half of it)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["threshold", "fpr", "fpr95_lower", "fpr95_upper", "tpr", "tpr95_lower", "tpr95_upper"])
            for row in zip(roc.thresholds, fpr, f_lo, f_hi, tpr, t_lo, t_hi):
                w.writerow([repr(float(x)) for x in row])
        print(f"csv: {args.csv}", file=sys.stderr)
    if args.plot:
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(5, 5))
        for k in range(fpr.size):  # each threshold's box: the data's (FPR, TPR) lies in all of them at 95%
            ax.add_patch(plt.Rectangle((f_lo[k], t_lo[k]), f_hi[k] - f_lo[k], t_hi[k] - t_lo[k], alpha=0.12, lw=0))
        order = np.lexsort((tpr, fpr))
        ax.plot(fpr[order], tpr[order], label=f"DP ROC, AUC {roc.auc:.3f}")
        ax.plot([0, 1], [0, 1], ls=":", color="grey")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title("95% simultaneous boxes (shaded)", fontsize=9)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        plt.close(fig)
        print(f"plot: {args.plot}", file=sys.stderr)
