"""The client's cost per report against two HPKE seals (the floor of one seal per share, wire format
1, the unit issue 21's goal is stated in); and `dpcdf submit` end to end, with both servers on this
machine.

    python bench/bench_client.py [--n 2000] [--repeat 5] [--submit 20000] [--batch 1000]

`make_reports` (grid index, DCF key pair, each key serialized and sealed to its server under a
fresh report id: format 2, a capsule per server per call and AES-GCM per share) is timed per report for count tasks, unverified and verified (the verified share
carries the check's extra field elements), and for a label task; in the same run, on the same core,
the two seals alone (pyca/cryptography's HPKE, the same suite, key and share sizes). Best of
`--repeat` rounds (CPU time, the two taking turns); one thread (OpenSSL and numba here use one core). No server is needed: the task
config names two throwaway HPKE public keys.

`--submit N` (0: skipped) then starts two real servers on loopback (`dpcdf serve`, kernels warm) and
times `dpcdf submit --csv` of N values as a user runs it (a new process: start-up, reading the CSV,
row digests, making and spooling the reports, uploading to both servers until both acknowledged
each) for each task kind, then the same command again (a re-run: nothing to make or send). In the same
run, taking turns with it, `make_reports` alone and the two seals alone on the N values (wall time,
one process), so that the ratios hold on a machine busy with other work. CPU columns: CPU seconds per
report of the submit process and of the two servers together (from /proc), and the rate the three
would reach if they had this machine's cores to themselves (cores / CPU per report). The processes
run with Python's bytecode cached (in a temporary PYTHONPYCACHEPREFIX, filled first), as an
installed package has it.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dpcdf.service import hpke
from dpcdf.service.client import make_reports
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.service.wire import Sealer, capsule_length, hpke_info


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def config(bits: int, payload: str, verify: bool, kem: str = "x25519") -> TaskConfig:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    keys = [X25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex() for _ in (0, 1)]
    grid = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": bits}
    return TaskConfig(grid, 1.0, "tree", "substitution", 1, ("http://127.0.0.1:1", "http://127.0.0.1:2"),
                      (keys[0], keys[1]), token_hash("t"), payload=payload, kem=kem, verify=verify)


def best_of_interleaved(fns, repeat: int) -> list[float]:
    """The least CPU time (this process, one thread) of each function over `repeat` rounds, the
    functions taking turns within a round, so that a busy machine slows them alike."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            t = time.process_time()
            fn()
            times[k].append(time.process_time() - t)
    return [min(t) for t in times]


def seals_only(cfg: TaskConfig, n: int, share_len: int) -> None:
    """The floor: two seals per report of `share_len`-byte shares, nothing else."""
    suite = hpke.suite(cfg.kem)
    pks = [hpke.public_key(cfg.kem, h) for h in cfg.hpke_keys]
    share, fp = secrets.token_bytes(share_len), cfg.fingerprint  # (the fingerprint is computed per access)
    for _ in range(n):
        rid = secrets.token_bytes(16)
        for party in (0, 1):
            suite.encrypt(share, pks[party], info=hpke_info(fp, rid, party))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def submit_table(n: int, batch: int, rounds: int) -> None:
    """`dpcdf submit` end to end against two local servers, next to make_reports and the seals alone."""
    from dpcdf.service.client import create_task
    from dpcdf.service.http import http
    from dpcdf.service.processes import start_server, stop

    cores = os.cpu_count() or 1
    print(f"\ndpcdf submit --csv of n = {n} values, --batch {batch}, both servers on this machine ({cores} cores); "
          f"wall time, best of {rounds}; make_reports and the seals alone in the same rounds\n")
    print(f"{'task':<30} {'submit reports/s':>16} {'re-run s':>8} {'make reports/s':>14} {'2 seals reports/s':>17} {'submit/make':>11} {'submit/seals':>12} {'client cpu us':>13} {'servers cpu us':>14} {'cpu-bound reports/s':>19} {'start-up cpu s':>14}")  # noqa: E501 (one source line: test_docs reads the header from it)

    with tempfile.TemporaryDirectory(prefix="dpcdf-bench-client-") as tmp:
        # bytecode cached, as an installed package has it (this machine's sessions set PYTHONDONTWRITEBYTECODE,
        # which made every process compile dpcdf and fss from source: 0.3 s of the client's CPU per run)
        env = dict(os.environ, DPCDF_TESTING="1", PYTHONDONTWRITEBYTECODE="", PYTHONPYCACHEPREFIX=f"{tmp}/pycache")
        subprocess.run([sys.executable, "-c", "import dpcdf.cli, dpcdf.service.client, dpcdf.service.server.app"],
                       env=env, check=True)
        procs = [start_server(p, f"{tmp}/server{p}", noise=False, extra_env=env) for p in (0, 1)]
        urls = [u for _, u in procs]
        try:
            while not all(http("GET", f"{u}/health")["warm"] for u in urls):  # kernels compiled: measure the work
                time.sleep(0.2)
            rng = np.random.default_rng(1)  # the simulated values only
            for name, bits, verify in (("count, 2^10 grid, verified", 10, True),
                                       ("count, 2^10 grid, unverified", 10, False),
                                       ("count, 2^16 grid, verified", 16, True)):
                vals = rng.uniform(0, 1, n)
                data = Path(tmp) / "values.csv"
                data.write_text("value\n" + "".join(f"{float(v)!r}\n" for v in vals))
                best = {"submit": [], "rerun": [], "make": [], "seals": [], "client": [], "servers": []}
                for r in range(rounds):
                    config, _ = create_task(urls, {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": bits}, 1.0, "tree",
                                            "substitution", 1, verify=verify)
                    task = Path(tmp) / f"task{r}.json"
                    task.write_text(config.to_json())
                    command = [sys.executable, "-m", "dpcdf", "submit", "--task", str(task), "--csv", str(data),
                               "--batch", str(batch)]
                    if r == 0:
                        make_reports(config, vals[:50])  # this process's kernels compiled (or loaded)
                        share_len = len(make_reports(config, vals[:1])[0].sealed[0][1]) - 16
                    servers0, client0, t = sum(cpu_seconds(p.pid) for p, _ in procs), children_cpu(), time.perf_counter()
                    run = subprocess.run(command, capture_output=True, text=True, env=env)
                    wall = time.perf_counter() - t
                    if run.returncode != 0:
                        raise SystemExit(f"dpcdf submit failed: {run.stderr[-2000:]}")
                    best["client"].append((children_cpu() - client0) / n)
                    best["servers"].append((sum(cpu_seconds(p.pid) for p, _ in procs) - servers0) / n)
                    best["submit"].append(wall)
                    t = time.perf_counter()
                    again = subprocess.run(command, capture_output=True, text=True, env=env)
                    best["rerun"].append(time.perf_counter() - t)
                    if again.returncode != 0 or '"new": 0' not in again.stdout:
                        raise SystemExit(f"the re-run made or failed: {again.stdout[-500:]} {again.stderr[-2000:]}")
                    t = time.perf_counter()
                    make_reports(config, vals)
                    best["make"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    seals_only(config, n, share_len)
                    best["seals"].append(time.perf_counter() - t)
                small = Path(tmp) / "ten.csv"  # the command's fixed CPU: the same command on 10 values
                small.write_text("value\n" + "".join(f"{float(v)!r}\n" for v in vals[:10]))
                client0 = children_cpu()
                subprocess.run(command[:-4] + ["--csv", str(small), "--spool", str(small) + f".{bits}{verify}.spool"] + command[-2:], capture_output=True, env=env, check=True)
                startup = children_cpu() - client0
                submit, make, seals = n / min(best["submit"]), n / min(best["make"]), n / min(best["seals"])
                client, servers = min(best["client"]), min(best["servers"])
                print(f"{name:<30} {submit:>16.0f} {min(best['rerun']):>8.2f} {make:>14.0f} {seals:>17.0f} "
                      f"{submit / make:>11.2f} {submit / seals:>12.2f} {client * 1e6:>13.0f} {servers * 1e6:>14.0f} "
                      f"{cores / (client + servers):>19.0f} {startup:>14.2f}")
        finally:
            for proc, _ in procs:
                stop(proc)


class _NoSeal:
    """Stands in for `wire.Sealer` in make_reports: a capsule and ciphertexts of the real lengths, no
    sealing."""

    def __init__(self, public_key, fingerprint: bytes, party: int, kem: str = "x25519"):
        self.capsule, self.tag = bytes(capsule_length(kem)), bytes(16)

    def seal(self, report_id: bytes, share: bytes) -> bytes:
        return share + self.tag


def format2_seals(cfg: TaskConfig, n: int, share_len: int, per: int = 1000) -> None:
    """What make_reports seals (format 2): per server a capsule every `per` reports (one HPKE seal)
    and one AES-GCM seal per share."""
    pks = [hpke.public_key(cfg.kem, h) for h in cfg.hpke_keys]
    share, fp = secrets.token_bytes(share_len), cfg.fingerprint
    for i in range(n):
        if i % per == 0:
            sealers = [Sealer(pk, fp, party, cfg.kem) for party, pk in enumerate(pks)]
        rid = secrets.token_bytes(16)
        for sealer in sealers:
            sealer.seal(rid, share)


def breakdown_table(n: int, repeat: int) -> None:
    """CPU per report of each stage of a verified 2^10 task's path, in this process on one core. The
    HPKE calls are timed alone (the client's two seals, a server's open); the rest of make_reports
    and of a server's checks (`ingest.accept`) are timed with those calls stubbed out (the seal by
    a ciphertext of the right length, the open by a lookup of its plaintext), so neither is the
    difference of two noisy figures. Also the client's spool (each report committed, read back for
    each server, each server's answer recorded) and one server's store and round one of the check
    (its background thread held back, round one run after the uploads). Best of `repeat` rounds of
    n reports, 1000 per batch, after one round not counted (kernels and the task's constants load)."""
    from unittest import mock

    from dpcdf.service.client import data_holder
    from dpcdf.service.client.spool import Spool
    from dpcdf.service.protocols.check import round_one
    from dpcdf.service.server.limits import Failures, Limits
    from dpcdf.service.server import ingest
    from dpcdf.service.server.state import Server
    from dpcdf.service.wire import Opener, Report, decode_batch, encode_batch

    print(f"\nCPU per report by stage, count, 2^10 grid, verified: one core, in-process, n = {n}, best of {repeat}\n")
    print(f"{'party':<8} {'stage':<48} {'us':>7}")
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="dpcdf-bench-stages-") as tmp:
        os.environ.setdefault("DPCDF_ADMIN_TOKEN", secrets.token_urlsafe(32))
        servers = [Server(p, f"{tmp}/s{p}", noise=False) for p in (0, 1)]
        keys = tuple(s.keys.public_hex("x25519") for s in servers)
        srv = servers[0]
        srv.checker.wake = lambda task_id: None  # round one timed on its own, below
        no_seal = mock.patch.object(data_holder, "Sealer", _NoSeal)
        for r in range(repeat + 1):
            cfg = TaskConfig({"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 10}, 1.0, "tree", "substitution", 1,
                             ("http://127.0.0.1:1", "http://127.0.0.1:2"), (keys[0], keys[1]), token_hash("t"), verify=True)
            srv.register(cfg)
            st, failures = srv.task(cfg.task_id), Failures(Limits())
            vals = np.random.default_rng(r).uniform(0, 1, n)
            times = dict.fromkeys(("seals", "seals2", "make", "spool", "open", "checks", "store", "round one"), 0.0)
            spool = Spool.open(f"{tmp}/spool{r}.sqlite", cfg.fingerprint)
            admitted = spool.admit(spool.digests(vals), "bench")
            opener = Opener(srv.keys.private("x25519"), cfg.fingerprint, 0)
            for lo in range(0, n, 1000):
                chunk = vals[lo : lo + 1000]
                with no_seal:
                    t = time.process_time()
                    make_reports(cfg, chunk)
                    times["make"] += time.process_time() - t
                made = make_reports(cfg, chunk)
                t = time.process_time()
                seals_only(cfg, len(made), len(made[0].sealed[0][1]) - 16)
                times["seals"] += time.process_time() - t
                t = time.process_time()
                format2_seals(cfg, len(made), len(made[0].sealed[0][1]) - 16)
                times["seals2"] += time.process_time() - t
                t = time.process_time()
                spool.add(admitted, [(m.report_id, m.to_bytes(), b"d" * 16, lo + k) for k, m in enumerate(made)])
                for party in (0, 1):
                    rows = spool.unacknowledged(party, 1000, lo - 1)
                    body = encode_batch([b for _, b in rows])
                    spool.record(party, [row for row, _ in rows], {})
                times["spool"] += time.process_time() - t
                raws = decode_batch(body)
                sealed = [(rep.report_id, *rep.sealed[0]) for rep in map(Report.from_bytes, raws)]
                t = time.process_time()
                plain = {rid: opener(rid, capsule, ct) for rid, capsule, ct in sealed}
                times["open"] += time.process_time() - t
                with mock.patch.object(ingest, "Opener", lambda *a: lambda rid, capsule, ct, version=2: plain[rid]):
                    t = time.process_time()
                    good, _ = ingest.accept(srv, st, raws, "bench", failures)
                    times["checks"] += time.process_time() - t
                t = time.process_time()
                srv.add_reports(st, good)
                times["store"] += time.process_time() - t
            t = time.process_time()
            round_one.catch_up(st.ctx)
            times["round one"] += time.process_time() - t
            spool.close()
            for k, v in times.items():  # round 0 loads the kernels and the task's constants: not counted
                best[k] = min(best.get(k, 1e9), v / n * 1e6) if r else 1e9
    rows = [("client", "2 HPKE seals (format 1: one per share)", best["seals"]),
            ("client", "2 capsules per 1000 + 2 AES-GCM seals", best["seals2"]),
            ("client", "make_reports without its seals", best["make"]),
            ("client", "spool: commit, read back, record 2 answers", best["spool"]),
            ("server", "open (a capsule per 1000 + AES-GCM)", best["open"]),
            ("server", "upload's checks without the open (accept)", best["checks"]),
            ("server", "store (SQLite)", best["store"]),
            ("server", "round one of the check", best["round one"])]
    for party, stage, us in rows:
        print(f"{party:<8} {stage:<48} {us:>7.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="reports per timed run (default 2000)")
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds; the best is shown (default 5)")
    ap.add_argument("--submit", type=int, default=20000, metavar="N",
                    help="values per end-to-end dpcdf submit run (default 20000; 0 skips the end-to-end table)")
    ap.add_argument("--batch", type=int, default=1000, help="dpcdf submit --batch (default 1000)")
    ap.add_argument("--rounds", type=int, default=2, help="end-to-end rounds per task; the best is shown (default 2)")
    args = ap.parse_args()
    from fss import backend

    backend.set_threads(1)  # one core: the kernels' thread pool too
    print(f"CPU: {cpu_name()}, fss tier {backend.current()}; one core, CPU time; n = {args.n} reports per run, best of {args.repeat}\n")
    print(f"{'task':<34} {'make_reports us':>15} {'2 seals us':>10} {'ratio':>6} {'reports/s':>10}")
    rng = np.random.default_rng(0)  # the simulated values only
    for name, bits, payload, verify in (("count, 2^10 grid, unverified", 10, "count", False),
                                        ("count, 2^10 grid, verified", 10, "count", True),
                                        ("count, 2^16 grid, verified", 16, "count", True),
                                        ("count, 2^20 grid, unverified", 20, "count", False),
                                        ("label, 2^10 grid, unverified", 10, "label", False)):
        cfg = config(bits, payload, verify)
        vals = rng.uniform(0, 1, args.n)
        labels = rng.integers(0, 2, args.n) if payload == "label" else None
        make_reports(cfg, vals[:50], None if labels is None else labels[:50])  # compile/load the kernels
        share_len = len(make_reports(cfg, vals[:1], None if labels is None else labels[:1])[0].sealed[0][1]) - 16
        made, seals = (t / args.n * 1e6 for t in best_of_interleaved(
            [lambda: make_reports(cfg, vals, labels), lambda: seals_only(cfg, args.n, share_len)], args.repeat))
        print(f"{name:<34} {made:>15.1f} {seals:>10.1f} {made / seals:>6.2f} {1e6 / made:>10.0f}")
    breakdown_table(args.n, args.repeat)
    if args.submit > 0:
        submit_table(args.submit, args.batch, args.rounds)


if __name__ == "__main__":
    main()
