"""The `dpcdf` command: serve, task, submit, close, query, demo, warm-up, admin (`cli_admin`).

Every error ends the command with one line `dpcdf: ...` on stderr and exit status 2, never a
traceback (DPCDF_DEBUG=1 shows the traceback of an unexpected one). The heavy modules (numpy, numba,
the service, scipy) load inside the command that needs them, so `dpcdf --help` answers at once.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
from pathlib import Path

from .cli_admin import add_parser as add_admin_parser, cmd_admin
from .cli_query import analyst_from_args, close_with_progress, cmd_query, cmd_status
from .cli_inputs import CliError, load_task, parse_grid, read_csv, read_number
from .errors import DpcdfError, ParameterError
from .service.files import read_text

DEBUG_ENV = "DPCDF_DEBUG"
EXTRA_OF = {"scipy": "release", "osqp": "release", "cryptography": "service", "fastapi": "service", "starlette": "service",
            "pydantic": "service", "uvicorn": "service", "matplotlib": "demo", "sklearn": "examples", "dask": "dask",
            "distributed": "dask"}  # optional dependencies (pyproject.toml's extras) by top-level module
POSTPROCESS_CHOICES = ["auto", "none", "monotone", "monotone-l1", "sparse", "smooth"]  # dpcdf.release.ecdf.POSTPROCESS (a test checks)


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (`dpcdf: ...`, exit 2) and defaults in every --help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"dpcdf: {self.prog.removeprefix('dpcdf ')}: {message} (see {self.prog} --help)"
              if self.prog != "dpcdf" else f"dpcdf: {message} (see dpcdf --help)", file=sys.stderr)
        sys.exit(2)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, unless it has none (None, False) or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default == [] or default is argparse.SUPPRESS
                or "default" in text or action.option_strings == [] or isinstance(action, argparse._HelpAction)):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {shown})"


def _min_batch(args) -> int:
    if args.min_batch is not None:
        return args.min_batch
    return 100 if args.relation == "substitution" else 0


def default_spool(args, config) -> str:
    """The spool next to the task file: one per task, whatever the input (it tells inputs apart by
    their rows' content), so that a re-run, an extended input or a copy of one are all recognised."""
    return f"{args.task}.{config.task_id[:12]}.spool"


def cmd_serve(args) -> None:
    from .service.server import serve

    from .service.storage.retention import parse_duration

    retention = None if args.retention is None else parse_duration(args.retention)
    if args.sweep_every <= 0:
        raise ParameterError(f"--sweep-every must be a positive number of seconds, got {args.sweep_every}")
    from .service.server.limits import Limits

    for flag, bits, low, high in (("--client-prefix-v4", args.client_prefix_v4, 8, 32),
                                  ("--client-prefix-v6", args.client_prefix_v6, 16, 128)):
        if not low <= bits <= high:
            raise ParameterError(f"{flag} must be a prefix length from {low} to {high} bits, got {bits}")
    limits = Limits(prefix_v4=args.client_prefix_v4, prefix_v6=args.client_prefix_v6)
    serve(args.party, args.port, args.data, args.host, noise=not args.no_noise,
          admin_token_file=args.admin_token_file, tls_cert=args.tls_cert, tls_key=args.tls_key,
          dask=args.dask, log_format=args.log_format, retention=retention, sweep_every=args.sweep_every, dask_insecure=args.dask_insecure,
          limits=limits)


def cmd_task(args) -> None:
    admin = None
    if args.admin_token_file:
        if len(args.admin_token_file) > 2:
            raise CliError("--admin-token-file takes one file for both servers, or one per server")
        admin = [read_text(f, "operator token file").strip() for f in args.admin_token_file]
        admin = (admin * 2)[:2]
    for url in args.servers:
        if not url.startswith(("http://", "https://")):
            raise CliError(f"--servers: {url!r} is not a server URL (http://HOST:PORT or https://...)")
    if args.epsilon is not None and not (math.isfinite(args.epsilon) and args.epsilon > 0):
        raise CliError(f"--epsilon must be a positive number, got {args.epsilon}")
    if args.rho is not None and not (math.isfinite(args.rho) and args.rho > 0):
        raise CliError(f"--rho must be a positive number, got {args.rho}")
    grid_spec = parse_grid(args.grid)
    from .service.client import create_task
    from .service.files import write_secret
    from .service.task import TaskConfig

    privacy = "pure" if args.rho is None else "zcdp"
    mechanism = args.mechanism or TaskConfig.default_mechanism(grid_spec, args.relation, privacy, args.epsilon, args.payload)
    out = _reserve_out(args.out)  # before the servers register anything: an earlier task's files are never replaced
    try:
        config, token = create_task(args.servers, grid_spec, args.epsilon, mechanism, args.relation, _min_batch(args),
                                    args.kem, payload=args.payload, admin_tokens=admin,
                                    verify=False if args.unverified else (True if args.verified else None), rho=args.rho,
                                    name=args.name)
        write_secret(args.out + ".token", token.encode())
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    out.write_text(config.to_json())
    print(f"task {config.task_id}{f' ({config.name})' if config.name else ''} on both servers ({mechanism} mechanism, payload {args.payload}); "
          f"config {args.out}, analyst token {args.out}.token")


def _reserve_out(out: str) -> Path:
    """Creates the task file `out` empty (an empty one left by an interrupted run is reused), so that an
    existing task's config and token are never replaced and an unwritable place fails before the
    servers register the task."""
    path, token = Path(out), Path(out + ".token")
    for f in (path, token):
        if f.is_dir():
            raise CliError(f"--out: {f} is a directory")
        if f.exists() and f.stat().st_size > 0:
            raise CliError(f"--out: {f} already exists (an earlier task's {'analyst token' if f == token else 'config'}; "
                           "replacing it would lose that task): give another --out, or remove the files of a task you no longer want")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    except OSError as exc:
        raise CliError(f"--out: cannot write {out} ({exc.strerror}); nothing was registered") from None
    return path


def cmd_submit(args) -> None:
    # the input first (csv only, no numpy): a mistake there is told before the service is loaded
    if args.values is None and args.csv is None:
        raise CliError("give the values: --csv FILE (with --column NAME if it has several columns) or --values V1 V2 ...")
    if args.values is not None and args.csv is not None:
        raise CliError("give --csv or --values, not both")
    if args.label_column is not None and args.csv is None:
        raise CliError("--label-column reads labels from --csv")
    read_text(args.task, "task file")
    if args.csv is not None:
        values, labels, contents, lines = read_csv(args.csv, args.column, args.label_column)
        source = os.path.realpath(args.csv)
    else:
        if not args.values:
            raise CliError("--values needs at least one value")
        values = [read_number(v, f"--values, value {i + 1}") for i, v in enumerate(args.values)]
        labels, contents, lines = None, None, list(range(1, len(values) + 1))
        source = "--values"
    if not 1 <= args.batch <= 1 << 16:  # dpcdf.service.wire.MAX_BATCH
        raise CliError(f"--batch must be in [1, 65536], got {args.batch}")
    from .service.client import UploadIncomplete, submit

    config = load_task(args.task)
    if config.make_grid().shifts_integers(values):
        print("warning: the values look like integers and some fall between the task's grid thresholds: F(t) at such an "
              "integer t is read at the threshold below it (values equal to t count at the next one); a grid with "
              "a threshold on every integer answers exactly (dpcdf task --grid integers:LO:HI)", file=sys.stderr)
    needs_labels = config.payload.labelled
    if needs_labels and args.label_column is None:
        raise CliError(f"this is a {config.payload} task: each value needs its 0/1 label (--label-column NAME)")
    if not needs_labels and args.label_column is not None:
        raise CliError("this task counts values only: --label-column belongs to label and calibration tasks")
    spool = args.spool or default_spool(args, config)
    for party, (url, key) in enumerate(zip(config.servers, config.hpke_keys)):  # check these are the two you trust
        print(f"server {party}: {url} (HPKE key {config.kem} {key[:16]}...{key[-8:]})", file=sys.stderr)
    print(f"spool: {spool} (every report is kept there until both servers acknowledge it)", file=sys.stderr)
    args.interrupted = (f"interrupted; every report made so far is kept in the spool {spool}: run the same command "
                        "again to resume (nothing is sent twice)")
    try:
        summary = submit(config, values, args.batch, progress=True, labels=labels, spool=spool,
                         retry_for=args.retry_for, source=source, contents=contents, lines=lines,
                         allow_duplicates=args.allow_duplicates, outside=args.outside)
    except UploadIncomplete as exc:
        print(json.dumps(exc.summary))
        raise
    for note in summary.pop("notes", []):
        print(f"note: {note}", file=sys.stderr)
    print(json.dumps(summary))
    if summary["rejected"]:  # conflicts too (issue 42): another's share holds their ids, so they will not count
        taken = summary["conflicts"] and f"{summary['conflicts']} reports conflicted (report id taken by other content); "
        raise CliError(f"{taken or ''}the servers refused {summary['rejected']} reports for good ({summary['first_refusal']}); "
                       "they are not counted, and a re-run does not send them again")


def cmd_close(args) -> None:
    analyst = analyst_from_args(args)
    n = close_with_progress(analyst)
    print(f"task {analyst.config.task_id}: collection closed on both servers, "
          + (f"{n} reports counted" if n is not None else "the count stays private (add/remove)")
          + "; later uploads are refused. Ask with dpcdf query.")
    if analyst.rejected is not None:
        print(f"verified: the servers checked every report; excluded {sum(analyst.rejected.values())}"
              + "".join(f", {k} {v}" for k, v in sorted(analyst.rejected.items())))


def cmd_demo(args) -> None:
    from .demo import MIN_CLIENTS, run_demo

    if args.clients < MIN_CLIENTS:
        raise CliError(f"--clients must be at least {MIN_CLIENTS} (the task's minimum batch: the servers answer no "
                       f"query on fewer reports), got {args.clients}")
    if not (math.isfinite(args.epsilon) and args.epsilon > 0):
        raise CliError(f"--epsilon must be a positive number, got {args.epsilon}")
    if args.plot:  # before minutes of demo, not after
        where = Path(args.plot).resolve().parent
        if not where.is_dir() or not os.access(where, os.W_OK):
            raise CliError(f"--plot: cannot write {args.plot} ({where} is not a writable directory)")
    if isinstance(sys.stdout, io.TextIOWrapper):  # (a notebook's stream, or a StringIO, has no such setting)
        sys.stdout.reconfigure(line_buffering=True)  # progress as it happens, also through a pipe
    run_demo(args.clients, args.epsilon, args.mechanism, args.plot, warm=not args.no_warm_up)


def cmd_warm_up(args) -> None:
    from .warmup import warm_up

    warm_up(progress=True, verified=not args.quick)


COMMANDS = {"serve": cmd_serve, "task": cmd_task, "submit": cmd_submit, "close": cmd_close, "query": cmd_query, "status": cmd_status,
            "demo": cmd_demo, "warm-up": cmd_warm_up, "admin": cmd_admin}


def build_parser() -> Parser:
    ap = Parser(prog="dpcdf", description="Two-server differentially private ECDFs with function secret sharing. "
                "Run `dpcdf COMMAND --help` for a command's options; docs/service.md walks through them.")
    ap.add_argument("--ca-file", metavar="PEM", help="verify the servers' HTTPS certificates against these CAs only "
                    "(default: $DPCDF_CA_FILE, else the system's); dpcdf serve takes it too, for server 1's")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    s = sub.add_parser("serve", help="run one of the two servers",
                       description="Runs one of the two servers until Ctrl-C. Logs its URL, party, data directory and "
                       "operator token file at the start, then one line per request.")
    s.add_argument("--party", type=int, choices=[0, 1], required=True, help="0 (the leader) or 1 (the helper)")
    s.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    s.add_argument("--data", required=True, help="this server's directory: HPKE key, SQLite store, segments, operator token")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--no-noise", action="store_true", help="test-only: refused unless DPCDF_TESTING=1")
    s.add_argument("--admin-token-file", help="the operator's token, needed to register tasks (default: "
                   "$DPCDF_ADMIN_TOKEN, else DATA/admin.token, made at the first start)")
    s.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (and --tls-key); default: plain HTTP")
    s.add_argument("--tls-key", help="the certificate's PEM private key")
    s.add_argument("--ca-file", dest="serve_ca_file", metavar="PEM", help="server 0: verify server 1's HTTPS "
                   "certificate against these CAs only (default: $DPCDF_CA_FILE, else the system's); checked when a "
                   "task is registered")
    s.add_argument("--dask", metavar="ADDRESS", help="evaluate on a Dask cluster: a scheduler's address "
                   "(tls://HOST:8786, certificates in Dask's configuration; workers must see DATA/segments at the "
                   "same path) or local:N (N worker processes here); default: in-process")
    s.add_argument("--dask-insecure", action="store_true", help="allow a plain scheduler (tcp://HOST:8786): whoever reaches "
                   "it runs code on the workers, which hold this server's key shares, and in this server")
    s.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="text: uvicorn's access log, one line per request; json: one JSON object per line")
    s.add_argument("--retention", metavar="DURATION", help="delete a task's reports and key shares once it is this old "
                   "(30d, 12h, 90m, 45s) if they are still stored; default: never (verified tasks' go once their "
                   "release is final, whatever this is; docs/service.md#retention)")
    s.add_argument("--sweep-every", type=float, default=60.0, metavar="SECONDS", help="how often the retention sweep runs")
    s.add_argument("--client-prefix-v4", type=int, default=24, metavar="BITS", help="clients' budgets (connections, "
                   "uploads in flight, failures) count per IPv4 network of this prefix length (8-32; 32: per address)")
    s.add_argument("--client-prefix-v6", type=int, default=64, metavar="BITS", help="and per IPv6 network of this "
                   "prefix length (16-128; docs/service.md#limits-on-clients-without-a-token)")

    t = sub.add_parser("task", help="create a task on both servers; writes the config and the analyst token",
                       description="Registers a task with both servers (each needs its operator token) and writes the "
                       "task config (give it to every client) and the analyst token (keep it: it alone can close and query).")
    t.add_argument("--servers", nargs=2, required=True, metavar="URL", help="server 0's and server 1's URLs")
    t.add_argument("--grid", required=True, help="the thresholds: uniform:LO:HI:BITS, log:LO:HI:BITS (2^BITS "
                   "points from LO to HI), integers:LO:HI (every integer: integer data answered exactly at each) "
                   "or thresholds:T1,T2,...; values above the last are counted at it")
    budget = t.add_mutually_exclusive_group(required=True)
    budget.add_argument("--epsilon", type=float, help="epsilon-DP, discrete Laplace noise")
    budget.add_argument("--rho", type=float, help="rho-zCDP, discrete Gaussian noise (grids of up to 2^16 points)")
    t.add_argument("--mechanism", choices=["adaptive", "tree", "path", "factorization"],
                   help="default: adaptive (epsilon, count tasks on grids of 2^8 to 2^20 points: two rounds, "
                   "the second chosen from the first), else tree (label and calibration tasks, with --epsilon or --rho), "
                   "factorization (rho, count tasks: the square-root factorization, up to 2^13 points)")
    t.add_argument("--payload", default="count", choices=["count", "label", "calibration"],
                   help="count: the ECDF of the values; label: values are scores with a 0/1 label each, released "
                   "as a ROC curve (query --roc); calibration: values are predicted probabilities in [0, 1] with "
                   "their 0/1 outcome (query --hosmer-lemeshow)")
    t.add_argument("--relation", default="substitution", choices=["substitution", "add-remove"],
                   help="the neighbouring datasets the guarantee covers: substitution (one person's value changes, "
                   "n public) or add-remove (one person joins or leaves)")
    t.add_argument("--min-batch", type=int, default=None, help="queries wait for this many reports "
                   "(default 100 under substitution; under add/remove it must be 0)")
    t.add_argument("--kem", default="x25519", choices=["x25519", "mlkem768-x25519"], help="HPKE KEM of the sealed shares")
    checked = t.add_mutually_exclusive_group()
    checked.add_argument("--unverified", action="store_true", help="count reports unchecked (default: the servers check "
                         "every report at the close, for grids of up to 2^16 points; docs/verification.md)")
    checked.add_argument("--verified", action="store_true", help="check every report on grids of up to 2^20 points "
                         "too (both servers need a Dask cluster, dpcdf serve --dask; docs/scaling.md)")
    t.add_argument("--out", default="task.json", help="where to write the task config; the analyst token goes to OUT.token")
    t.add_argument("--name", help="a label for people, shown by dpcdf admin tasks and dpcdf status (public: in the config)")
    t.add_argument("--admin-token-file", nargs="+", metavar="FILE", help="the servers' operator token (one "
                   "file for both, or one per server; default: $DPCDF_ADMIN_TOKEN)")

    u = sub.add_parser("submit", help="report values (arguments or a CSV column) to both servers",
                       description="Seals one report per value into the spool and uploads it to both servers (at once, while the "
                       "next batch is made; a report is sent only once it is in the spool). Run "
                       "the same command again after any error or Ctrl-C: it sends only what is missing. The spool "
                       "remembers every row by content: re-running sends nothing new, an extended file sends only "
                       "its new rows, and rows already sent from another file are refused (--allow-duplicates).")
    u.add_argument("--task", required=True, help="the task config from dpcdf task")
    u.add_argument("--csv", help="a CSV file with a header row")
    u.add_argument("--column", help="the CSV column of the values (needed when the CSV has more than one column)")
    u.add_argument("--label-column", help="label and calibration tasks: the CSV column of each value's 0/1 label")
    u.add_argument("--values", nargs="*", help="the values themselves, instead of --csv")
    u.add_argument("--outside", default="clamp", choices=["clamp", "refuse"],
                   help="values outside the grid's range: clamp counts a value above the last threshold at it and one "
                   "below the first at the first (as the release defines the grid; counted in the summary), "
                   "refuse stops before anything is sent")
    u.add_argument("--allow-duplicates", action="store_true",
                   help="send rows equal to rows already sent to this task from another input (other people "
                   "with equal rows); without it such rows are refused, so a copied file is not counted twice")
    u.add_argument("--batch", type=int, default=1000, help="reports per request to each server, and per spool "
                   "transaction (1 to 65536); the next batch is made while one is sent")
    u.add_argument("--spool", help="where the sealed reports are kept until both servers acknowledge them "
                   "(default: TASK.TASKID.spool, next to the task file, one per task)")
    u.add_argument("--retry-for", type=float, default=30.0, help="seconds to keep retrying an unreachable server")

    for name, text in (("status", "the analyst's view of a task: each server's count and state (changes nothing)"),
                       ("close", "close the collection: the servers agree on one report set; no later upload counts"),
                       ("query", "the analyst: DP ECDF values and quantiles (the first query closes the collection)")):
        q = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        q.add_argument("--task", required=True, help="the task config from dpcdf task")
        q.add_argument("--token-file", help="the analyst token (default: TASK.token)")
        if name != "query":
            continue
        q.add_argument("--ecdf", nargs="*", type=float, default=[], metavar="T", help="values t at which to print F(t) (default: none)")
        q.add_argument("--quantiles", nargs="*", type=float, default=[0.1, 0.25, 0.5, 0.75, 0.9], metavar="P",
                       help="levels p in [0, 1] at which to print the quantile")
        q.add_argument("--json", action="store_true", help="print the F(t) values (with the threshold read and the "
                       "95%% band) and the quantiles as one JSON object, the Python API's numbers")
        q.add_argument("--csv", metavar="FILE", help="also write the whole release to FILE as CSV: each threshold's F "
                       "and its 95%% simultaneous band (a label task: each threshold's FPR and TPR with their bands)")
        q.add_argument("--plot", metavar="FILE", help="also draw the release with its 95%% band to FILE (PNG, needs "
                       "matplotlib: pip install 'fss-dpcdf[demo]'); a label task: the ROC curve with its band")
        q.add_argument("--bisect", action="store_true",
                       help="answer from prefix queries (Algorithm 1) instead of a post-processed full-grid release; "
                       "tree and path tasks only")
        q.add_argument("--postprocess", default="auto", choices=POSTPROCESS_CHOICES,
                       help="how the full-grid release is post-processed (default auto: smoothed for a tree on up to "
                       "2^12 points, else consistent and monotone; monotone: the plain fit)")
        q.add_argument("--roc", action="store_true", help="label tasks: the DP ROC curve and its AUC")
        q.add_argument("--hosmer-lemeshow", type=int, nargs="?", const=10, metavar="GROUPS",
                       help="calibration tasks: the DP Hosmer-Lemeshow test over GROUPS groups (default 10)")

    d = sub.add_parser("demo", help="two real servers on loopback, simulated clients, an analyst, a table and a plot")
    d.add_argument("--clients", type=int, default=3000, help="simulated clients (at least 10; the task's minimum batch is the smaller of 100 and this)")
    d.add_argument("--epsilon", type=float, default=1.0, help="the privacy budget")
    d.add_argument("--mechanism", default="adaptive", choices=["adaptive", "tree", "path"], help="the task's mechanism")
    d.add_argument("--plot", default="dpcdf_demo.png", help="where to write the plot (matplotlib)")
    d.add_argument("--no-warm-up", action="store_true", help="skip compiling the kernels first (dpcdf warm-up)")

    add_admin_parser(sub)
    w = sub.add_parser("warm-up", help="compile and cache the kernels the first commands need (once per machine)",
                       description="Compiles the numba kernels that serve, submit, close and query use, into numba's "
                       "on-disk cache, printing progress; later commands load them in a moment.")
    w.add_argument("--quick", action="store_true", help="skip the verified-report kernels")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for ca_file in (args.ca_file, getattr(args, "serve_ca_file", None)):
            if ca_file is not None:
                from .service.http import use_ca_file

                use_ca_file(ca_file)  # a bad file: one line now, not a failed request later
        COMMANDS[args.cmd](args)
        return 0
    except KeyboardInterrupt:
        print(file=sys.stderr)
        print(f"dpcdf: {getattr(args, 'interrupted', 'interrupted')}", file=sys.stderr)
        return 2
    except DpcdfError as exc:
        print(f"dpcdf: {_one_line(exc)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a lean install (`pip install fss-dpcdf` is fss alone): say which extra
        extra = EXTRA_OF.get((exc.name or "").split(".")[0])
        if extra is None:
            return _unexpected(exc)
        print(f"dpcdf: this command needs {exc.name}, which comes with pip install 'fss-dpcdf[{extra}]'", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"dpcdf: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: still one line, the traceback on request
        return _unexpected(exc)


def _unexpected(exc: Exception) -> int:
    if os.environ.get(DEBUG_ENV) == "1":
        raise exc
    print(f"dpcdf: unexpected error ({exc.__class__.__name__}: {_one_line(exc)}); please report it, with the "
          f"traceback that {DEBUG_ENV}=1 shows", file=sys.stderr)
    return 2


def run() -> None:
    """The `dpcdf` command (`python -m dpcdf`, the console script): `main`, then, with stdout and
    stderr flushed, an exit without the interpreter's teardown. Everything a command writes is
    closed or committed by the time `main` returns (spools and stores are SQLite transactions,
    files are written whole); the teardown only unloaded modules, numba's and LLVM's above all:
    about 0.2 s of CPU per command, 10 us per report of a 20,000-row `dpcdf submit`."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what is left unsaid is lost either way
            pass
    os._exit(code)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or exc.__class__.__name__
