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
One /24 against both servers (issue 42's goals; `--phases flood` runs only these, each attack on a
fresh pair of servers): the attacker sends from 127.0.0.0/24, the prefix of server 0 (whose messages
to server 1 come from 127.0.0.1) and of the analyst (127.0.0.1); honest batches of --batch reports
(--honest-reports of them, sent round again) go to server 0 from 127.0.9.1 (another /24), one after
the other, in --rounds pairs of windows of --window s: alone, then during the attack (from 2 s after
it starts); in the first, the analyst closes a task of 200 reports on both servers. The servers and
the honest client run on core 0, the attacker on core 1 (its CPU is not the servers', as from a
machine of its own), kept busy by a spin loop while the honest client is alone (`spin`):
  slow bodies   --slow-bodies connections to each server declare a 60,000-byte batch and send a
                byte every 3 s (below any minimum rate, above the 5 s pause limit), each opened again
                at once when the server drops it;
  keep-alive    --flood-conns connections to each server (from 33 addresses of the /24, as the review's)
                send GET /health every 4 s, each opened again --flood-pause s after the server drops it;
each attack's row: the servers' CPU during the attack (alone in brackets), what the attacker spent
(connections opened, bytes sent) and got (answers; none: dropped without one); then the honest
uploads' throughput (medians of the windows) and acceptance (batches answered 200) during the attack
and alone, and the close's outcome.
"""
from __future__ import annotations

import argparse
import asyncio
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


FAR, CROWD = "127.0.9.1", "127.0.0"  # the honest uploader's /24; the attacker's (server 0's and the analyst's)


class Crowd:
    """An attacker's connections, in a process of its own (not the honest client's GIL): `conns`
    connections to each port from addresses of 127.0.0.0/24 (`sources` of them, from .100), each
    sending `request` and then a byte every `trickle` s (if `trickle`), or `request` again every `every`
    s (keep-alive), and opened again `pause` s after the server drops it. `stop()` ends it and reads
    the counts: connections opened, bytes sent, answers by status (0: none, the connection dropped)."""

    def __init__(self, ports: list[int], conns: int, sources: int, request: bytes, every: float = 0.0,
                 trickle: float = 0.0, pause: float = 0.0):
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.stopping, self.results = ctx.Event(), ctx.Queue()
        plan = [(port, f"{CROWD}.{100 + i % sources}") for port in ports for i in range(conns)]
        self.proc = ctx.Process(target=self._run, args=(plan, (request, every, trickle, pause)), daemon=True)
        self.proc.start()

    def _run(self, plan: list[tuple[int, str]], args: tuple) -> None:
        self.counts, self.halt = [0, 0, {}], False  # opened, sent, statuses
        if len(os.sched_getaffinity(0)) == 1 and (os.cpu_count() or 1) > 1:  # `flood_rows` pinned the rest to core 0
            os.sched_setaffinity(0, {1})  # the attacker's CPU is not the servers' (as from a machine of its own)

        async def main() -> None:
            tasks = [asyncio.ensure_future(self._one(port, source, *args)) for port, source in plan]
            while not self.stopping.is_set():
                await asyncio.sleep(0.1)
            self.halt = True  # (a cancelled wait_for may still return on Python 3.11: the loops look too)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(main())
        self.results.put(self.counts)

    async def _one(self, port: int, source: str, request: bytes, every: float, trickle: float, pause: float) -> None:
        counts = self.counts
        while not self.halt:
            writer = None
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), 10)
                counts[0] += 1
                while not self.halt:
                    writer.write(request)
                    counts[1] += len(request)
                    if trickle:  # a byte every `trickle` s until an answer or the end
                        while not reader.at_eof() and not self.halt:
                            try:
                                line = await asyncio.wait_for(reader.readline(), trickle)
                            except asyncio.TimeoutError:
                                writer.write(b"x")
                                counts[1] += 1
                                continue
                            self._count(line)
                            break
                        break
                    line = await asyncio.wait_for(reader.readline(), 30)
                    if not self._count(line):
                        break
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                    length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
                    await reader.readexactly(length)
                    if b"connection: close" in head.lower():
                        break
                    await asyncio.sleep(every)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                pass
            finally:
                if writer is not None:
                    writer.close()
            await asyncio.sleep(pause)

    def _count(self, line: bytes) -> bool:
        """Counts an answer's status line; False if there is none (the server closed the connection)."""
        parts = line.split()
        code = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        self.counts[2][code] = self.counts[2].get(code, 0) + 1
        return code != 0

    def stop(self) -> tuple[int, int, dict]:
        self.stopping.set()
        try:
            counts = self.results.get(timeout=120)
        except Exception:
            print(f"crowd: no counts; alive {self.proc.is_alive()}, exit code {self.proc.exitcode}", flush=True)
            raise
        self.proc.join(10)
        return counts


def spin(until: float) -> None:
    """A busy loop on core 1 until `until` (time.time()): the attacker's core, kept as busy while the
    honest client is alone (on this 2-vCPU VM an idle core 1 made core 0's loopback uploads about 15%
    slower: measured, 52-60k against 64-66k reports/s, so alone and attacked windows run alike)."""
    os.sched_setaffinity(0, {1})
    while time.time() < until:
        pass


def honest_window(port: int, task: str, batches: list[bytes], per_batch: int, window: float) -> tuple[float, int, int]:
    """Honest batches from FAR for `window` s, one after the other: (reports/s acknowledged, batches
    answered 200, batches sent)."""
    t0, ok, sent = time.monotonic(), 0, 0
    while time.monotonic() - t0 < window:
        ok += post((port, FAR), f"/tasks/{task}/reports/batch", batches[sent % len(batches)]) == 200
        sent += 1
    return ok * per_batch / (time.monotonic() - t0), ok, sent


def flood_rows(tmp: str, args, rng: np.random.Generator) -> list[tuple[str, str, str]]:
    """Each attack from 127.0.0.0/24 on both servers of a fresh pair (no failure level left from
    another attack): its spend and answers, honest uploads meanwhile (as a share of alone), and an
    analyst's close during it."""
    rows, cores = [], os.sched_getaffinity(0)
    if len(cores) > 1:  # the servers and the honest client on core 0, the attacker on core 1 (`Crowd`)
        os.sched_setaffinity(0, {0})
    try:
        for attack in ("slow", "flood"):
            procs = [start_server(p, f"{tmp}/{attack}{p}") for p in (0, 1)]  # (they inherit core 0)
            try:
                urls = [u for _, u in procs]
                while not all(http("GET", f"{u}/health")["warm"] for u in urls):
                    time.sleep(0.2)
                rows += attack_rows(urls, [proc.pid for proc, _ in procs], attack, args, rng)
            finally:
                for proc, _ in procs:
                    stop(proc)
    finally:
        os.sched_setaffinity(0, cores)
    return rows


def attack_rows(urls: list[str], pids: list[int], attack: str, args, rng: np.random.Generator) -> list[tuple[str, str, str]]:
    ports = [int(u.rsplit(":", 1)[1]) for u in urls]
    config, _ = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1, verify=False)
    made = make_reports(config, rng.uniform(0, 1, args.honest_reports))
    batches = [encode_batch([r.to_bytes() for r in made[i : i + args.batch]]) for i in range(0, len(made), args.batch)]
    closing, token = closed_task(urls, 200, rng, close=False)  # uploaded before the attack
    if attack == "slow":
        name = f"slow bodies, 1 /24, {args.slow_bodies} conns per server"
        body = (f"POST /tasks/{config.task_id}/reports/batch HTTP/1.1\r\nHost: x\r\nContent-Type: {OCTETS}\r\n"
                "Content-Length: 60000\r\n\r\n").encode()
        start = lambda: Crowd(ports, args.slow_bodies, 16, body, trickle=3.0)  # noqa: E731
    else:
        name = f"keep-alive flood, 1 /24, {args.flood_conns:,} per server"
        start = lambda: Crowd(ports, args.flood_conns, 33, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",  # noqa: E731
                              every=4.0, pause=args.flood_pause)
    alone, during, spent, outcome, busy, idle = [], [], [0, 0, {}], {}, [], []

    def close() -> None:
        t = time.perf_counter()
        try:
            for url in urls:
                http("POST", f"{url}/tasks/{closing.task_id}/close", token=token)
            outcome["close"] = "close 200 on both servers"
        except ServerError as exc:
            outcome["close"] = f"close failed ({exc.status or 'no answer'})"
        outcome["seconds"] = time.perf_counter() - t

    for r in range(args.rounds):  # alternating windows: alone, then during the attack (2 s after it starts)
        used = sum(cpu_seconds(pid) for pid in pids), time.monotonic()
        spinner = None
        if len(os.sched_getaffinity(0)) == 1 and (os.cpu_count() or 1) > 1:
            import multiprocessing

            spinner = multiprocessing.get_context("fork").Process(target=spin, args=(time.time() + args.window + 0.5,))
            spinner.start()
        alone.append(honest_window(ports[0], config.task_id, batches, args.batch, args.window))
        if spinner is not None:
            spinner.join()
        idle.append((sum(cpu_seconds(pid) for pid in pids) - used[0]) / (time.monotonic() - used[1]))
        crowd = start()
        time.sleep(2)
        used = sum(cpu_seconds(pid) for pid in pids), time.monotonic()
        closer = threading.Timer(args.window / 2, close) if r == 0 else None
        if closer is not None:
            closer.start()
        during.append(honest_window(ports[0], config.task_id, batches, args.batch, args.window))
        if closer is not None:
            closer.join()
        busy.append((sum(cpu_seconds(pid) for pid in pids) - used[0]) / (time.monotonic() - used[1]))
        opened, sent, statuses = crowd.stop()
        spent[0], spent[1] = spent[0] + opened, spent[1] + sent
        for k, v in statuses.items():
            spent[2][k] = spent[2].get(k, 0) + v
        print(f"{name}, round {r}: honest {alone[-1]} alone, {during[-1]} during", flush=True)
        time.sleep(1)
    seconds = args.rounds * (args.window + 2)
    a, d = (float(np.median([w[0] for w in ws])) for ws in (alone, during))
    share = [sum(w[1] for w in ws) / max(1, sum(w[2] for w in ws)) for ws in (alone, during)]
    rows = [(name, f"servers {float(np.median(busy)):.2f} cores ({float(np.median(idle)):.2f})",
             f"attacker: {spent[0]:,} conns, {spent[1] / 1024:,.0f} KiB in {seconds:.0f} s; answers "
             + ", ".join(f"{k or 'none'}: {v:,}" for k, v in sorted(spent[2].items()))),
            ("  honest uploads meanwhile", f"{a:,.0f} reports/s alone",
             f"{d:,.0f} during ({d / a:.0%}); {share[1]:.0%} of batches accepted ({share[0]:.0%} alone)"),
            ("  the analyst's close meanwhile", "-", f"{outcome['close']} in {outcome['seconds']:.1f} s")]
    for row in rows:
        print(row, flush=True)
    return rows


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
    ap.add_argument("--phases", choices=("all", "peer", "flood"), default="all",
                    help="peer: only the peer path's rows; flood: only one /24's slow bodies and keep-alive flood")
    ap.add_argument("--junk-n", type=lambda s: [int(x) for x in s.split(",")], default=[3000, 120_000],
                    help="report counts of the junk /verify and /sync tasks, comma-separated")
    ap.add_argument("--junk-requests", type=int, default=200, help="junk messages per endpoint and n")
    ap.add_argument("--slow-addresses", type=int, default=8, help="addresses of 8 slow uploads each")
    ap.add_argument("--slow-bodies", type=int, default=16, help="slow bodies from one /24, per server")
    ap.add_argument("--flood-conns", type=int, default=1056, help="keep-alive connections from one /24, per server")
    ap.add_argument("--flood-pause", type=float, default=0.5, help="seconds before a dropped one is opened again")
    args = ap.parse_args()
    import dpcdf
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    print(f"dpcdf from {Path(dpcdf.__file__).parent}; {os.cpu_count()} cores ({cpu}); load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="dpcdf-exhaustion-") as tmp:
        if args.phases == "flood":  # on server pairs of their own
            return report(args.label, flood_rows(tmp, args, np.random.default_rng(7)))
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
        rows += flood_rows(tmp, args, rng)
    report(args.label, rows)


def report(label: str, rows: list[tuple[str, str, str]]) -> None:
    print(f"\n{label}")
    print(f"{'attack':38s} {'server resources':28s} {'outcome':s}")
    for name, resource, outcome in rows:
        print(f"{name:38s} {resource:28s} {outcome}")


if __name__ == "__main__":
    main()
