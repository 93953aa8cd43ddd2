"""The `dpcdf` command: serve, task, submit, query, demo."""
from __future__ import annotations

import argparse
import dataclasses
import csv
import json
import sys
from pathlib import Path

import numpy as np

from .analyst import Analyst
from .errors import DpcdfError
from .release.ecdf import POSTPROCESS
from .service.client import UploadIncomplete, create_task, submit
from .service.files import write_secret
from .service.task import TaskConfig


def parse_grid(spec: str) -> dict:
    """uniform:LO:HI:BITS, log:LO:HI:BITS or thresholds:T1,T2,..."""
    kind, _, rest = spec.partition(":")
    if kind in ("uniform", "log"):
        lo, hi, bits = rest.split(":")
        return {"kind": kind, "lo": float(lo), "hi": float(hi), "bits": int(bits)}
    if kind == "thresholds":
        return {"kind": kind, "values": [float(v) for v in rest.split(",")]}
    raise DpcdfError(f"grid must be uniform:LO:HI:BITS, log:LO:HI:BITS or thresholds:T1,T2,..., got {spec!r}")


def _min_batch(args) -> int:
    if args.min_batch is not None:
        return args.min_batch
    return 100 if args.relation == "substitution" else 0


def default_spool(args, config: TaskConfig) -> str:
    """The spool beside the input: one per input file and task, so that a re-run finds it."""
    return f"{args.csv if args.csv else args.task}.{config.task_id[:12]}.spool"


def read_values(args) -> np.ndarray:
    if args.values:
        return np.array(args.values, dtype=np.float64)
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    col = header.index(args.column) if args.column else 0
    try:
        return np.array([float(r[col]) for r in body if r])
    except (ValueError, IndexError) as exc:
        raise DpcdfError(f"{args.csv}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dpcdf", description="Two-server differentially private ECDFs.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run one of the two servers")
    s.add_argument("--party", type=int, choices=[0, 1], required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--no-noise", action="store_true", help="test-only: refused unless DPCDF_TESTING=1")
    s.add_argument("--admin-token-file", help="the operator's token, needed to register tasks (default: "
                   "$DPCDF_ADMIN_TOKEN, else DATA/admin.token, made at the first start)")
    s.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (and --tls-key)")
    s.add_argument("--tls-key", help="the certificate's PEM private key")
    s.add_argument("--dask", metavar="ADDRESS", help="evaluate on a Dask cluster: a scheduler's address "
                   "(tcp://HOST:8786; workers must see DATA/segments at the same path) or local:N (N worker "
                   "processes here); default: in-process")
    t = sub.add_parser("task", help="create a task on both servers; writes the config and the analyst token")
    t.add_argument("--servers", nargs=2, required=True)
    t.add_argument("--grid", required=True, help="uniform:LO:HI:BITS, log:LO:HI:BITS or thresholds:T1,T2,...")
    budget = t.add_mutually_exclusive_group(required=True)
    budget.add_argument("--epsilon", type=float, help="epsilon-DP, discrete Laplace noise")
    budget.add_argument("--rho", type=float, help="rho-zCDP, discrete Gaussian noise (grids of up to 2^16 points)")
    t.add_argument("--mechanism", choices=["adaptive", "tree", "path", "factorization"],
                   help="default: adaptive (epsilon, substitution, grids of 2^8 to 2^20 points: two rounds, the second "
                   "chosen from the first), else tree (epsilon), factorization (rho: the square-root factorization, up to 2^13 points)")
    t.add_argument("--relation", default="substitution", choices=["substitution", "add-remove"])
    t.add_argument("--min-batch", type=int, default=None, help="queries wait for this many reports "
                   "(default 100 under substitution; under add/remove it must be 0)")
    t.add_argument("--kem", default="x25519", choices=["x25519", "mlkem768-x25519"], help="HPKE KEM of the sealed shares")
    t.add_argument("--unverified", action="store_true", help="count reports unchecked (default: the servers check "
                   "every report at the close, for grids of up to 2^16 points; docs/verification.md)")
    t.add_argument("--out", default="task.json")
    t.add_argument("--admin-token-file", nargs="+", metavar="FILE", help="the servers' operator token (one "
                   "file for both, or one per server; default: $DPCDF_ADMIN_TOKEN)")
    u = sub.add_parser("submit", help="report values (arguments or a CSV column) to both servers")
    u.add_argument("--task", required=True)
    u.add_argument("--values", nargs="*", type=float)
    u.add_argument("--csv")
    u.add_argument("--column")
    u.add_argument("--batch", type=int, default=500)
    u.add_argument("--spool", help="where the sealed reports are kept until both servers acknowledge them "
                   "(default: next to the CSV, or to the task file for --values); run the same command again to resume")
    u.add_argument("--retry-for", type=float, default=30.0, help="seconds to keep retrying an unreachable server")
    q = sub.add_parser("query", help="the analyst: DP ECDF values and quantiles")
    q.add_argument("--task", required=True)
    q.add_argument("--token-file", help="default: TASK.token")
    q.add_argument("--ecdf", nargs="*", type=float, default=[])
    q.add_argument("--quantiles", nargs="*", type=float, default=[0.1, 0.25, 0.5, 0.75, 0.9])
    q.add_argument("--bisect", action="store_true",
                   help="answer from prefix queries (Algorithm 1) instead of a post-processed full-grid release")
    q.add_argument("--postprocess", default="auto", choices=list(POSTPROCESS),
                   help="how the full-grid release is post-processed (default auto: smoothed for a tree on up to "
                   "2^12 points, else consistent and monotone; monotone: the plain fit)")
    d = sub.add_parser("demo", help="two real servers on loopback, simulated clients, an analyst, a table and a plot")
    d.add_argument("--clients", type=int, default=3000)
    d.add_argument("--epsilon", type=float, default=1.0)
    d.add_argument("--mechanism", default="adaptive", choices=["adaptive", "tree", "path"])
    d.add_argument("--plot", default="dpcdf_demo.png")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "serve":
            from .service.server import serve

            serve(args.party, args.port, args.data, args.host, noise=not args.no_noise,
                  admin_token_file=args.admin_token_file, tls_cert=args.tls_cert, tls_key=args.tls_key,
                  dask=args.dask)
        elif args.cmd == "task":
            admin = None
            if args.admin_token_file:
                if len(args.admin_token_file) > 2:
                    raise DpcdfError("--admin-token-file takes one file for both servers, or one per server")
                try:
                    admin = [Path(f).read_text().strip() for f in args.admin_token_file] * (3 - len(args.admin_token_file))
                except OSError as exc:
                    raise DpcdfError(f"cannot read the operator token: {exc}") from None
            grid_spec = parse_grid(args.grid)
            mechanism = args.mechanism or TaskConfig.default_mechanism(grid_spec, args.relation, "pure" if args.rho is None else "zcdp",
                                                                         args.epsilon)
            config, token = create_task(args.servers, grid_spec, args.epsilon, mechanism,
                                        args.relation, _min_batch(args), args.kem, admin_tokens=admin[:2] if admin else None,
                                        verify=False if args.unverified else None, rho=args.rho)
            Path(args.out).write_text(config.to_json())
            write_secret(args.out + ".token", token.encode())
            print(f"task {config.task_id} on both servers; config {args.out}, analyst token {args.out}.token")
        elif args.cmd == "submit":
            config = TaskConfig.from_json(Path(args.task).read_text())
            if not args.values and not args.csv:
                raise DpcdfError("give --values or --csv")
            spool = args.spool or default_spool(args, config)
            print(f"spool: {spool} (every report is kept there until both servers acknowledge it)", file=sys.stderr)
            try:
                print(json.dumps(submit(config, read_values(args), args.batch, progress=True, spool=spool,
                                        retry_for=args.retry_for)))
            except UploadIncomplete as exc:
                print(json.dumps(dataclasses.asdict(exc.status)))
                raise
        elif args.cmd == "query":
            config = TaskConfig.from_json(Path(args.task).read_text())
            token = Path(args.token_file or args.task + ".token").read_text().strip()
            analyst = Analyst(config, token)
            source = analyst if args.bisect else analyst.release(args.postprocess)
            for t_, f_ in zip(args.ecdf, source.ecdf(args.ecdf)):
                print(f"F({t_:g}) = {f_:.4f}")
            for p_, q_ in zip(args.quantiles, source.quantile(args.quantiles)):
                print(f"q({p_:g}) = {q_:g}")
            print(analyst.mechanism.statement())
            if analyst.rejected is not None:
                print(f"verified: the servers checked every report; excluded {sum(analyst.rejected.values())}"
                      + "".join(f", {k} {v}" for k, v in sorted(analyst.rejected.items())))
        elif args.cmd == "demo":
            from .demo import run_demo

            run_demo(args.clients, args.epsilon, args.mechanism, args.plot)
        return 0
    except DpcdfError as exc:
        print(f"dpcdf: {exc}", file=sys.stderr)
        return 2
