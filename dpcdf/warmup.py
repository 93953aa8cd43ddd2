"""`dpcdf warm-up`: compiles the numba kernels that a user's first commands need (the client's key
generation, the servers' evaluation and report checks, the noise and the release's post-processing)
into numba's on-disk cache, so that no later command waits for the compiler. The first time on a
machine this takes a minute or two; afterwards a second or so (it only loads the cache).

A line on stderr names each step as it starts, and another every few seconds while one runs, so a
long compile is never silent."""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable

TICK = 5.0  # seconds between progress lines while a step runs


def _fss_count() -> None:
    import numpy as np

    from fss import DCF, backend

    for width in (1, 2, 3):  # count, label and calibration payloads
        backend.warm_up(width=width)
        dcf = DCF(4, 64, width, cmp="ge")  # as a task's (`TaskConfig.dcf`)
        keys, _ = dcf.gen_batch(np.arange(3), 1 if width == 1 else np.ones((3, width), np.int64))
        dcf.eval_sum(keys, [3])
        dcf.eval_sum(keys, [1, 2, 5])
        dcf.eval_grid(keys, 16)


def _verified() -> None:
    from .service.protocols.check import round_one

    round_one.warm_up()


def _release() -> None:
    import numpy as np

    from .release.ecdf import release_ecdf
    from .release.grid import Grid

    values = np.random.default_rng(0).uniform(0, 100, 300)  # throwaway data: only the compile matters
    grid = Grid.uniform(0, 100, 10)
    for mechanism in ("adaptive", "tree", "path"):
        release_ecdf(values, grid, 1.0, mechanism=mechanism).quantile([0.5])
    release_ecdf(values, grid, 1.0, mechanism="tree", relation="add-remove").quantile([0.5])


STEPS: list[tuple[str, Callable[[], None], bool]] = [
    ("key generation and evaluation (fss kernels)", _fss_count, False),
    ("verified reports (F_p kernels and the servers' check)", _verified, True),
    ("noise and the release's post-processing", _release, False),
]


def warm_up(progress: bool = True, verified: bool = True, out=None) -> float:
    """Runs every step (the verified one only if `verified`); returns the seconds it took. With
    `progress`, prints each step and a line every TICK seconds to `out` (stderr)."""
    out = out or sys.stderr
    start = time.perf_counter()
    steps = [(name, fn) for name, fn, needs_verified in STEPS if verified or not needs_verified]
    for k, (name, fn) in enumerate(steps, start=1):
        t0 = time.perf_counter()
        if progress:
            print(f"warm-up {k}/{len(steps)}: {name} ...", file=out, flush=True)
        done = threading.Event()

        def tick(name=name, t0=t0) -> None:
            while not done.wait(TICK):
                print(f"warm-up {k}/{len(steps)}: still compiling {name} ({time.perf_counter() - t0:.0f} s; "
                      "once per machine)", file=out, flush=True)

        ticker = threading.Thread(target=tick, daemon=True) if progress else None
        if ticker:
            ticker.start()
        try:
            fn()
        finally:
            done.set()
            if ticker:
                ticker.join()
    took = time.perf_counter() - start
    if progress:
        print(f"warm-up: done in {took:.1f} s; the kernels are cached for every later command", file=out, flush=True)
    return took
