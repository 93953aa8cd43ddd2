"""Cold start of `fss`: what a fresh Python process waits for before its first keys and sums.

    python bench/bench_coldstart.py                 # 4 fresh interpreters sharing one new, empty cache dir
    python bench/bench_coldstart.py --runs 6 --cache-dir /tmp/c   # reuse (or create) a cache dir
    python bench/bench_coldstart.py --src /tmp/old  # time another checkout's `fss` (PYTHONPATH=/tmp/old)

Each run is a new interpreter (subprocess) with NUMBA_CACHE_DIR set to the cache dir, so run 1 of a
new dir is a cold cache (numba compiles every kernel) and later runs show what a machine where the
package was used once pays. Columns, in seconds: import = `import fss`; gen = the first
`DCF(32).gen_batch` (2,000 keys, including the backend's self-test); sum1 = the first `eval_sum` at
one point; sumN = the first `eval_sum` at 100 points (another kernel); first = gen + sum1 (the
target: at most 0.5 s with a warm cache). Every run also checks that it reconstructs the right counts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
import fss
from fss import DCF, backend
t1 = time.perf_counter()
f = DCF(32)
alphas = (np.arange(2000, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(1 << 32)
k0, k1 = f.gen_batch(alphas, 1)
t2 = time.perf_counter()
s0 = f.eval_sum(k0, [123456789])
t3 = time.perf_counter()
pts = np.arange(100, dtype=np.uint64) * np.uint64(40000000)
m0 = f.eval_sum(k0, pts)
t4 = time.perf_counter()
s1, m1 = f.eval_sum(k1, [123456789]), f.eval_sum(k1, pts)
ok = int(f.reconstruct(s0, s1)[0]) == int((alphas > 123456789).sum()) and \
    [int(v) for v in f.reconstruct(m0, m1)] == [int((alphas > p).sum()) for p in pts]
print(json.dumps(dict(imp=t1 - t0, gen=t2 - t1, sum1=t3 - t2, sumN=t4 - t3, ok=ok, backend=backend.current())))
"""


def run_once(cache_dir: str, src: str | None) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True,
                         cwd=src or tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4, help="fresh interpreters to start (default 4)")
    ap.add_argument("--cache-dir", help="NUMBA_CACHE_DIR for all runs (default: a new empty temp dir)")
    ap.add_argument("--src", help="directory to put first on PYTHONPATH (another checkout's fss)")
    args = ap.parse_args()
    tmp = None
    if args.cache_dir:
        cache_dir = args.cache_dir
        os.makedirs(cache_dir, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="fss-coldstart-")
        cache_dir = tmp.name
    state = "cold" if not os.listdir(cache_dir) else "warm"
    print(f"cache dir {cache_dir} ({'empty' if state == 'cold' else 'not empty'}), src {args.src or 'installed fss'}")
    print(f"{'run':>3} {'cache':>5} {'backend':>8} {'import':>7} {'gen':>7} {'sum1':>7} {'sumN':>7} {'first':>7}  ok")
    try:
        for i in range(args.runs):
            r = run_once(cache_dir, args.src)
            print(f"{i + 1:>3} {state:>5} {r['backend']:>8} {r['imp']:7.3f} {r['gen']:7.3f} {r['sum1']:7.3f} "
                  f"{r['sumN']:7.3f} {r['gen'] + r['sum1']:7.3f}  {'yes' if r['ok'] else 'NO'}")
            state = "warm"
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
