"""`dpcdf warm-up`: compiles the numba kernels that a user's first commands need (the client's key
generation, the servers' evaluation and report checks, the noise and the release's post-processing)
into numba's on-disk cache, so that no later command waits for the compiler. The first time on a
machine this takes a minute or two; afterwards a second or so (it only loads the cache).

A line on stderr names each step as it starts, and another every few seconds while one runs, so a
long compile is never silent."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

TICK = 5.0  # seconds between progress lines while a step runs


PAYLOADS = ("count", "label", "calibration")  # `Payload`'s names (its width is the DCF's, `TaskConfig.dcf`)


def _fss(payload: str) -> None:
    import numpy as np

    from fss import DCF, backend

    from .release.payload import Payload

    width = Payload.parse(payload).width
    backend.warm_up(width=width)
    dcf = DCF(4, 64, width, cmp="ge")  # as a task's (`TaskConfig.dcf`)
    keys, _ = dcf.gen_batch(np.arange(3), 1 if width == 1 else np.ones((3, width), np.int64))
    dcf.eval_sum(keys, [3])
    dcf.eval_sum(keys, [1, 2, 5])
    dcf.eval_grid(keys, 16)


def _verified(payload: str) -> None:
    from .service.protocols.check import round_one

    round_one.warm_up((payload,))


def _release(_: str = "") -> None:
    import numpy as np

    from .release.ecdf import release_ecdf
    from .release.grid import Grid

    values = np.random.default_rng(0).uniform(0, 100, 300)  # throwaway data: only the compile matters
    grid = Grid.uniform(0, 100, 10)
    for mechanism in ("adaptive", "tree", "path"):
        release_ecdf(values, grid, 1.0, mechanism=mechanism).quantile([0.5])
    release_ecdf(values, grid, 1.0, mechanism="tree", relation="add-remove").quantile([0.5])


KINDS: dict[str, Callable[[str], None]] = {"fss": _fss, "verified": _verified, "release": _release}


def steps(verified: bool = True) -> list[tuple[str, str, str]]:
    """(kind, payload, what it compiles), longest first (the order they start in)."""
    out = [("fss", p, f"key generation and evaluation, {p} payload (fss kernels)") for p in PAYLOADS]
    if verified:
        out += [("verified", p, f"verified {p} reports (F_p kernels and the servers' check)") for p in PAYLOADS]
    return out + [("release", "", "noise and the release's post-processing")]


def warm_up(progress: bool = True, verified: bool = True, out=None, jobs: int | None = None) -> float:
    """Runs every step (the verified ones only if `verified`); returns the seconds it took. With
    `progress`, prints each step as it starts and a line every TICK seconds to `out` (stderr).
    `jobs` > 1 (default: on a machine with 2 cores or more) compiles in two processes at once: the
    fss kernels in one, the check's and the release's in the other (numba compiles on one thread;
    the processes share fss's disk cache, `fss.backend.info()["cache_dir"]`). About 1.4x faster from
    a cold cache on 2 cores; more processes would compile the kernels they share twice."""
    out = out or sys.stderr
    todo = steps(verified)
    lanes = [[k for k, step in enumerate(todo, start=1) if (step[0] == "fss") == first] for first in (True, False)]
    parallel = (jobs or os.cpu_count() or 1) > 1
    start = time.perf_counter()
    running: dict[int, float] = {}  # step -> when it started
    lock = threading.Lock()
    done = threading.Event()

    def say(line: str) -> None:
        if progress:
            with lock:
                print(line, file=out, flush=True)

    def begin(k: int, lane: list[int]) -> None:
        with lock:
            for other in lane:
                running.pop(other, None)
            running[k] = time.perf_counter()
        say(f"warm-up {k}/{len(todo)}: {todo[k - 1][2]} ...")

    def tick() -> None:
        while not done.wait(TICK):
            with lock:
                now = sorted((k, time.perf_counter() - t0) for k, t0 in running.items())
            for k, took in now:
                if took < 1:  # just started: said by its own line
                    continue
                say(f"warm-up {k}/{len(todo)}: still compiling {todo[k - 1][2]} ({took:.0f} s; once per machine)")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        if parallel:
            _in_processes(todo, lanes, begin, running, lock)
        else:
            for k, (kind, payload, _) in enumerate(todo, start=1):
                begin(k, list(running))
                KINDS[kind](payload)
    finally:
        done.set()
        ticker.join()
    took = time.perf_counter() - start
    say(f"warm-up: done in {took:.1f} s; the kernels are cached for every later command")
    return took


def _in_processes(todo, lanes: list[list[int]], begin: Callable[[int, list[int]], None], running: dict,
                  lock: threading.Lock) -> None:
    """Each lane's steps in one child process (`python -m dpcdf.warmup K:KIND:PAYLOAD ...`, which
    prints K as it starts step K), the lanes at once; RuntimeError with the child's stderr if one fails."""
    children = []
    for lane in lanes:
        log = tempfile.TemporaryFile()  # not a pipe: a chatty child never blocks on its stderr
        args = [f"{k}:{todo[k - 1][0]}:{todo[k - 1][1]}" for k in lane]
        child = subprocess.Popen([sys.executable, "-m", "dpcdf.warmup", *args], stdout=subprocess.PIPE, stderr=log)
        children.append((lane, child, log))

    def follow(lane: list[int], child: subprocess.Popen) -> None:
        assert child.stdout is not None  # (stdout=PIPE)
        for line in child.stdout:
            begin(int(line), lane)

    readers = [threading.Thread(target=follow, args=(lane, child), daemon=True) for lane, child, _ in children]
    for reader in readers:
        reader.start()
    failed = None
    for (lane, child, log), reader in zip(children, readers):
        reader.join()
        if child.wait() != 0 and failed is None:
            log.seek(0)
            failed = RuntimeError("warm-up failed:\n" + log.read().decode(errors="replace")[-2000:])
        with lock:
            for k in lane:
                running.pop(k, None)
        log.close()
    if failed:
        raise failed


if __name__ == "__main__":  # one lane of steps, in a child process of warm_up
    for arg in sys.argv[1:]:
        k, kind, payload = arg.split(":")
        print(k, flush=True)
        KINDS[kind](payload)
