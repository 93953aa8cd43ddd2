"""How much of a server can one unauthenticated client hold? Memory and time per stalled connection,
CPU per second of garbage uploads from one address, and honest upload throughput from another
address meanwhile, on a real server process on loopback (issue 20).

    python bench/bench_exhaustion.py [--conns 6] [--stall-mib 60] [--window 8] [--attackers 4]

Phases, against server 0 (the attacker's source address is 127.0.2.1, the honest client's 127.0.0.1:
budgets count per /24 since issue 42, so each party has a /24 of its own):
  stalled body  --conns connections each send headers for a 63 MiB batch upload, then --stall-mib MiB
                of it, then nothing: the server's RSS growth per connection, and how long until the
                server drops each connection (observed for at most --hold-limit s);
  slow headers  --conns connections send half a request line and headers, then nothing: how long held;
  garbage       --attackers threads send batches of random reports (right framing, the task's
                fingerprint, random sealed shares of the right lengths: each costs an HPKE open that
                fails) as fast as they are answered, for --window s: the server's CPU (cores) and RSS;
                then --flood threads send one such report per request (from 127.0.3.1);
  honest        one thread uploads valid batches (--batch reports) as fast as they are answered,
                in --rounds alternating windows of --window/2 s: alone, then while both attacks run
                (the attackers' addresses are refused by then: the steady state): reports/s.
Peer path (issue 42; `--phases peer` runs only these, against server 1, which takes /sync and /verify):
  junk peer     for each n of --junk-n, a closed unverified task of n reports; --junk-requests junk
                41-byte /verify and /sync messages (no request tag, or a wrong one: the old code
                ignores the header), each on a fresh connection from addresses 127.x.y.1 (at most 8
                per /24, so no prefix reaches its refusal level), the tasks' requests interleaved:
                the median time to the answer, and the ratio between the largest and the smallest n
                (a timing channel on n if it grows);
  slow uploads  --slow-addresses addresses x 8 uploads whose bodies trickle (a byte a second) fill the
                upload pool while the analyst closes a task of the smallest n: the close's outcome,
                and an honest upload's answer meanwhile.
"""
from __future__ import annotations

import argparse
import http.client as httpc
import os
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from dpcdf.service.client import create_task, make_reports
from dpcdf.service.http import ServerError, fetch, http
from dpcdf.service.processes import start_server, stop
from dpcdf.service.wire import encode_batch

GRID = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 10}
ATTACKER, ATTACKER2, HONEST = "127.0.2.1", "127.0.3.1", "127.0.0.1"  # three /24s: budgets count per prefix
MIB = 1 << 20
OCTETS = "application/octet-stream"
JUNK = {"verify": bytes([5]) + bytes(40), "sync": bytes([1]) + bytes(40)}  # a 41-byte message of kind 5 (check) and 1 (digests)
KINDS = (("verify", False), ("verify", True), ("sync", False), ("sync", True))  # each junk message, without and with a wrong tag


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def connect(port: int, source: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    return s


def held_for(socks: list[socket.socket], since: float, limit: float) -> list[float]:
    """Seconds from `since` until the server closed each socket (an answer then EOF, or a reset),
    capped at `limit` (then still open)."""
    out = [limit] * len(socks)

    def watch(i: int, s: socket.socket) -> None:
        s.settimeout(0.5)
        while time.monotonic() - since < limit:
            try:
                if not s.recv(65536):
                    out[i] = time.monotonic() - since
                    return
            except socket.timeout:
                continue
            except OSError:
                out[i] = time.monotonic() - since
                return

    threads = [threading.Thread(target=watch, args=(i, s)) for i, s in enumerate(socks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def stalled_bodies(pid: int, port: int, task: str, conns: int, stall: int, limit: float) -> tuple[float, list[float]]:
    """(RSS growth per connection in MiB at its peak, seconds each connection was held)."""
    time.sleep(1)
    base = rss_mib(pid)
    socks = []
    piece = os.urandom(MIB)
    for _ in range(conns):
        s = connect(port, ATTACKER)
        s.sendall(f"POST /tasks/{task}/reports/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                  f"Content-Length: {63 * MIB}\r\n\r\n".encode())
        socks.append(s)

    def push(s: socket.socket) -> None:
        s.settimeout(10)
        try:
            for _ in range(stall):
                s.sendall(piece)
        except OSError:
            pass  # the server stopped reading or closed

    threads = [threading.Thread(target=push, args=(s,)) for s in socks]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for t in threads:
        t.join()
    held = held_for(socks, t0, limit)
    done.set()
    sampler.join()
    for s in socks:
        s.close()
    return (peak[0] - base) / conns, held


def slow_headers(port: int, conns: int, limit: float) -> list[float]:
    socks = []
    for _ in range(conns):
        s = connect(port, ATTACKER)
        s.sendall(b"POST /tasks/x/reports HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(s)
    held = held_for(socks, time.monotonic(), limit)
    for s in socks:
        s.close()
    return held


def garbage_batch(config, size: int, count: int, rng: np.random.Generator) -> bytes:
    """Reports with the task's framing and fingerprint and random sealed shares of honest lengths."""
    real = make_reports(config, [0.5])[0]
    reports = []
    for _ in range(count):
        sealed = [(rng.bytes(len(enc)), rng.bytes(len(ct))) for enc, ct in real.sealed]
        out = [b"DPR1", config.fingerprint, rng.bytes(16)]
        for enc, ct in sealed:
            out += [struct.pack("<H", len(enc)), enc, struct.pack("<I", len(ct)), ct]
        reports.append(b"".join(out))
    return encode_batch(reports)


def post(conn_args: tuple, path: str, body: bytes) -> int:
    """One POST on a fresh connection from the given source address; the status (0: no answer)."""
    port, source = conn_args
    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("POST", path, body, {"Content-Type": "application/octet-stream"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, httpc.HTTPException):
        return 0
    finally:
        conn.close()


def honest_uploads(port: int, task: str, batches: list[bytes], per_batch: int, window: float, stop_at: threading.Event | None = None) -> float:
    """Reports/s acknowledged (stored, or duplicates once the batches come round again), uploading
    the batches one after the other for `window` s."""
    t0, done, i = time.monotonic(), 0, 0
    while time.monotonic() - t0 < window:
        if post((port, HONEST), f"/tasks/{task}/reports/batch", batches[i % len(batches)]) == 200:
            done += per_batch
        i += 1
    return done / (time.monotonic() - t0)


class Attack:
    """`threads` threads sending `body` to `path` from `source`, each as fast as it is answered, while
    `running` is set; `statuses` counts the answers (0: the connection closed without one)."""

    def __init__(self, port: int, source: str, path: str, body: bytes, threads: int):
        self.running, self.stopped, self.statuses = threading.Event(), threading.Event(), {}
        self.threads = [threading.Thread(target=self._loop, args=(port, source, path, body), daemon=True)
                        for _ in range(threads)]
        for t in self.threads:
            t.start()

    def _loop(self, port: int, source: str, path: str, body: bytes) -> None:
        while not self.stopped.is_set():
            if not self.running.wait(0.1):
                continue
            code = post((port, source), path, body)
            self.statuses[code] = self.statuses.get(code, 0) + 1

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(60)


def busy_cores(pid: int, seconds: float, idle: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0) - idle


def closed_task(urls: list[str], n: int, rng: np.random.Generator, close: bool = True) -> tuple:
    """An unverified task of `n` reports on both servers, closed by its analyst if `close`: (config, token)."""
    config, token = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1, verify=False)
    made = make_reports(config, rng.uniform(0, 1, n))
    for i in range(0, n, 2000):
        batch = encode_batch([r.to_bytes() for r in made[i : i + 2000]])
        for url in urls:
            fetch("POST", f"{url}/tasks/{config.task_id}/reports/batch", batch, content_type=OCTETS)
    if close:
        http("POST", f"{urls[0]}/tasks/{config.task_id}/close", token=token)
    return config, token


def junk_once(port: int, task: str, path: str, source: str, tag: bool) -> tuple[float, int]:
    """Seconds from sending a junk message to /tasks/{task}/{path} on a fresh connection from `source`
    (with `tag`, a request tag that is not the other server's) to its whole answer; its status (0: none)."""
    headers = {"Content-Type": OCTETS}
    if tag:
        headers["Dpcdf-Peer"] = f"v1 {JUNK[path][:17].hex()} {'00' * 32}"
    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    conn.connect()
    t = time.perf_counter()
    try:
        conn.request("POST", f"/tasks/{task}/{path}", JUNK[path], headers)
        resp = conn.getresponse()
        resp.read()
        code = resp.status
    except (OSError, httpc.HTTPException):
        code = 0
    took = time.perf_counter() - t
    conn.close()
    return took, code


def slow_uploads(port: int, task: str, addresses: int) -> list[socket.socket]:
    """8 uploads per address prefix (127.200.x.1, one /24 each) whose bodies trickle: started, one byte
    sent each second by a thread until the sockets close."""
    socks = []
    for a in range(addresses):
        for _ in range(8):
            s = connect(port, f"127.200.{1 + a}.1")
            s.sendall(f"POST /tasks/{task}/reports HTTP/1.1\r\nHost: x\r\nContent-Type: {OCTETS}\r\n"
                      f"Content-Length: 60000\r\n\r\n".encode())
            socks.append(s)

    def trickle() -> None:
        while socks:
            for s in list(socks):
                try:
                    s.send(b"x")
                except OSError:
                    socks.remove(s)
            time.sleep(1)

    threading.Thread(target=trickle, daemon=True).start()
    return socks


def peer_rows(urls: list[str], args, rng: np.random.Generator) -> list[tuple[str, str, str]]:
    """The peer path's rows: junk /verify and /sync at each n, the ratio, and the close under slow uploads."""
    port1 = int(urls[1].rsplit(":", 1)[1])
    rows, tasks = [], {}
    for n in args.junk_n:
        t = time.perf_counter()
        tasks[n] = closed_task(urls, n, rng)[0].task_id
        print(f"task of {n:,} reports made, uploaded and closed in {time.perf_counter() - t:.1f} s", flush=True)
    took: dict = {}
    statuses: dict = {}
    sent = 0
    for path, tag in KINDS:  # the tasks' requests interleaved, so that the machine's load drifts alike for each n
        for _ in range(args.junk_requests):
            for n in args.junk_n:
                source = f"127.{1 + (sent // 8) // 250}.{1 + (sent // 8) % 250}.1"  # 8 per /24: none refused
                seconds, code = junk_once(port1, tasks[n], path, source, tag)
                took.setdefault((path, tag, n), []).append(seconds)
                counts = statuses.setdefault((path, tag, n), {})
                counts[code] = counts.get(code, 0) + 1
                sent += 1
    medians = {key: float(np.median(values)) for key, values in took.items()}
    for n in args.junk_n:
        for path, tag in KINDS:
            rows.append((f"junk /{path}{', wrong tag' if tag else ''}, n = {n:,}", f"{medians[path, tag, n] * 1e3:.2f} ms median",
                         f"{args.junk_requests} sent; answers " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses[path, tag, n].items()))))
            print(rows[-1], flush=True)
    lo, hi = min(args.junk_n), max(args.junk_n)
    for path, tag in KINDS:
        rows.append((f"junk /{path}{', wrong tag' if tag else ''}: n {hi // 1000}k/{lo // 1000}k",
                     f"{medians[path, tag, hi] / medians[path, tag, lo]:.2f}x the time", "goal: at most 1.2x"))
    config, token = closed_task(urls, lo, rng, close=False)
    socks = slow_uploads(port1, config.task_id, args.slow_addresses)
    time.sleep(1)
    honest = post((port1, HONEST), f"/tasks/{config.task_id}/reports", make_reports(config, [0.5])[0].to_bytes())
    t = time.perf_counter()
    try:
        http("POST", f"{urls[0]}/tasks/{config.task_id}/close", token=token)
        closed = "close 200"
    except ServerError as exc:
        closed = f"close failed ({exc.status})"
    took = time.perf_counter() - t
    sent = len(socks)
    for s in list(socks):
        s.close()
    socks.clear()
    rows.append((f"slow uploads, {args.slow_addresses} addresses x 8", f"{sent} bodies held open",
                 f"{closed} in {took:.1f} s; an honest upload meanwhile: {honest}"))
    print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=6)
    ap.add_argument("--stall-mib", type=int, default=60)
    ap.add_argument("--hold-limit", type=float, default=30.0)
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--attackers", type=int, default=4, help="connections sending garbage batches")
    ap.add_argument("--flood", type=int, default=16, help="connections sending garbage single reports")
    ap.add_argument("--rounds", type=int, default=3, help="honest windows alone and under attack, alternating")
    ap.add_argument("--garbage-mib", type=float, default=10.0, help="size of each garbage batch")
    ap.add_argument("--batch", type=int, default=500, help="reports per honest batch")
    ap.add_argument("--honest-reports", type=int, default=20_000)
    ap.add_argument("--label", default="")
    ap.add_argument("--phases", choices=("all", "peer"), default="all", help="peer: only the peer path's rows")
    ap.add_argument("--junk-n", type=lambda s: [int(x) for x in s.split(",")], default=[3000, 120_000],
                    help="report counts of the junk /verify and /sync tasks, comma-separated")
    ap.add_argument("--junk-requests", type=int, default=200, help="junk messages per endpoint and n")
    ap.add_argument("--slow-addresses", type=int, default=8, help="addresses of 8 slow uploads each")
    args = ap.parse_args()
    import dpcdf
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    print(f"dpcdf from {Path(dpcdf.__file__).parent}; {os.cpu_count()} cores ({cpu}); load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="dpcdf-exhaustion-") as tmp:
        procs = [start_server(p, f"{tmp}/s{p}") for p in (0, 1)]
        urls = [u for _, u in procs]
        pid, port = procs[0][0].pid, int(urls[0].rsplit(":", 1)[1])
        try:
            while not all(http("GET", f"{u}/health")["warm"] for u in urls):
                time.sleep(0.2)
            rng = np.random.default_rng(7)
            rows = peer_rows(urls, args, rng)
            if args.phases == "peer":
                return report(args.label, rows)
            config, _ = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1, verify=False)
            task = config.task_id
            t = time.perf_counter()
            made = make_reports(config, rng.uniform(0, 1, args.honest_reports))
            batches = [encode_batch([r.to_bytes() for r in made[i : i + args.batch]])
                       for i in range(0, len(made) - args.batch + 1, args.batch)]
            print(f"made {len(made)} honest reports in {time.perf_counter() - t:.1f} s "
                  f"({len(batches[0]) / len(made[:args.batch]):.0f} bytes each)")
            report_bytes = len(made[0].to_bytes())
            garbage = garbage_batch(config, report_bytes, max(1, int(args.garbage_mib * MIB) // (report_bytes + 4)), rng)
            print(f"garbage batch: {len(garbage) / MIB:.1f} MiB, {struct.unpack_from('<I', garbage)[0]} reports")

            per_conn, held = stalled_bodies(pid, port, task, args.conns, args.stall_mib, args.hold_limit)
            print(f"stalled bodies: {per_conn:.1f} MiB per connection, held {held}", flush=True)
            rows.append(("stalled 63 MiB body", f"{per_conn:.1f} MiB/conn",
                         f"held {min(held):.1f}-{max(held):.1f} s" + (" (still open)" if max(held) >= args.hold_limit else "")))
            time.sleep(2)
            held = slow_headers(port, args.conns, args.hold_limit)
            print(f"slow headers: held {held}", flush=True)
            rows.append(("slow headers", "-",
                         f"held {min(held):.1f}-{max(held):.1f} s" + (" (still open)" if max(held) >= args.hold_limit else "")))
            time.sleep(2)

            idle0, t0 = cpu_seconds(pid), time.monotonic()
            time.sleep(3)
            idle = (cpu_seconds(pid) - idle0) / (time.monotonic() - t0)
            path = f"/tasks/{task}/reports"
            junk = garbage_batch(config, report_bytes, 1, rng)[8:]  # one report of the batch
            attacks = [(f"garbage batches, 1 address ({args.attackers} conns)", Attack(port, ATTACKER, path + "/batch", garbage, args.attackers)),
                       (f"garbage reports, 1 address ({args.flood} conns)", Attack(port, ATTACKER2, path, junk, args.flood))]
            for name, attack in attacks:
                rss0 = rss_mib(pid)
                attack.running.set()
                busy = busy_cores(pid, args.window, idle)
                attack.running.clear()
                rows.append((name, f"{busy:.2f} cores, +{rss_mib(pid) - rss0:.0f} MiB",
                             "answers " + ", ".join(f"{k}: {v}" for k, v in sorted(attack.statuses.items()))))
                print(rows[-1], flush=True)
            time.sleep(1)
            alone, during = [], []  # alternating windows: the honest client alone, then with both attacks
            for r in range(args.rounds):
                alone.append(honest_uploads(port, task, batches, args.batch, args.window / 2))
                for _, attack in attacks:
                    attack.running.set()
                during.append(honest_uploads(port, task, batches, args.batch, args.window / 2))
                for _, attack in attacks:
                    attack.running.clear()
                print(f"honest round {r}: {alone[-1]:,.0f} alone, {during[-1]:,.0f} under both attacks", flush=True)
            for _, attack in attacks:
                attack.stop()
            a, d = float(np.median(alone)), float(np.median(during))
            rows.append(("honest uploads (127.0.0.1)", f"{a:,.0f} reports/s alone",
                         f"{d:,.0f} under both attacks ({d / a:.0%}; medians of {args.rounds} windows)"))
        finally:
            for proc, _ in procs:
                stop(proc)
    report(args.label, rows)


def report(label: str, rows: list[tuple[str, str, str]]) -> None:
    print(f"\n{label}")
    print(f"{'attack':38s} {'server resources':28s} {'outcome':s}")
    for name, resource, outcome in rows:
        print(f"{name:38s} {resource:28s} {outcome}")


if __name__ == "__main__":
    main()
