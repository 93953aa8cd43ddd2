"""Speed of `fss` next to the machine's AES limits and sycret, all measured in the same run.

    python bench/bench_fss.py            # add --quick for a smaller run, --no-grid to skip the full grids,
                                         # --eval-grid for the eval_grid section alone

Columns (per core unless said otherwise): gen = key pairs/s, eval = evals/s (one point per key),
sum = keys/s of eval_sum at one point on all cores; "ECB bound" = pycryptodome AES-ECB blocks/s on a
32 MiB buffer divided by the AES blocks one eval needs (the limit of a level-by-level backend),
"VAES peak" = the same with a register-only 512-bit VAES loop (the limit of any implementation of
this construction on this CPU). The eval_grid section: grid points (key x point) per second on one
core, on each backend, against the same bounds for the AES blocks one point costs there (a full
grid of 2^b points expands 2^b - 1 nodes per key: 2 + 2 width blocks each over F_p, plus width LEAF
blocks per point for width > 1).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from Crypto.Cipher import AES
from numba import njit, types
from numba.extending import intrinsic

from fss import DCF, backend
from fss import _aes as A
from fss._fused import _Ptr, _c64, _level_loop
from fss.params import TreeParams


def best_of(fn, reps: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def ecb_blocks_per_s() -> float:
    buf = np.zeros(32 << 20, np.uint8)
    out = np.empty_like(buf)
    c = AES.new(bytes(16), AES.MODE_ECB)
    return buf.size / 16 / best_of(lambda: c.encrypt(memoryview(buf), output=memoryview(out)), 5)


def vaes_blocks_per_s() -> float:
    """A register-only MMO loop over 12 x 4 blocks with 512-bit VAES (0 if the CPU has none)."""
    if not A.has_vaes512():
        return 0.0

    @intrinsic
    def spin(typingctx, rk, iters, out):
        def codegen(context, b, signature, args):
            aes = A.AesRounds(b, _Ptr(context, b, signature.args[0], args[0]).data, True)
            final = _level_loop(b, args[1], [A.const8(r) for r in range(12)], lambda i, s: aes.mmo(list(s)))
            acc = final[0]
            for v in final[1:]:
                acc = b.xor(acc, v)
            _Ptr(context, b, signature.args[2], args[2]).store8(_c64(0), acc)
            return context.get_dummy_value()

        return types.void(rk, types.int64, out), codegen

    @njit
    def run(rk, iters, out):
        spin(rk, iters, out)

    out = np.zeros(8, np.uint64)
    iters = 1_000_000
    return iters * 48 / best_of(lambda: run(A.round_keys(), iters, out))


def eval_blocks(p: TreeParams) -> int:
    return p.bits * p.eval_blocks + (0 if p.width == 1 else p.value_blocks)


def gen_blocks(p: TreeParams) -> int:
    return 2 * (p.bits * p.expand_blocks + (0 if p.width == 1 else p.value_blocks))


def grid_blocks(p: TreeParams, size: int) -> float:
    """AES blocks per point of eval_grid over a full grid of size = 2^bits points."""
    leaf = 0 if p.width == 1 else (p.width if p.prime else p.value_blocks)
    return ((size - 1) * p.expand_blocks + size * leaf) / size


def eval_grid_section(quick: bool, ecb: float, vaes: float) -> None:
    """eval_grid of the servers' functions (DCF over F_p, x >= alpha) on one core, on every backend."""
    print(f"\neval_grid, one core (VAES peak {vaes / 1e6:.0f} M blocks/s in this run): every key's shares at every point")
    head = f"{'function':<42} {'keys':>6} {'points':>6} {'blocks/pt':>9} | {'backend':<8} {'M pts/s':>8} {'ECB bound':>9} {'VAES bound':>10} {'of bound':>8}"
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(3)
    before = backend.threads()
    backend.set_threads(1)
    for fn, n in ((DCF(10, group="p61", cmp="ge"), 10_000), (DCF(10, width=2, group="p61", cmp="ge"), 10_000),
                  (DCF(16, group="p61", cmp="ge"), 200)):
        n = n // 5 if quick else n
        size = 1 << fn.bits
        with backend.using("portable"):
            k0, _ = fn.gen_batch(rng.integers(0, size, n), 1)
        per = grid_blocks(fn.params, size)
        for name in reversed(backend.available()):
            with backend.using(name):
                t = best_of(lambda: fn.eval_grid(k0, size), 1 if name == "portable" else 3)
            rate = n * size / t
            label = repr(fn).replace("out_bits=61, ", "") if name == backend.available()[-1] else ""
            print(f"{label:<42} {n:>6} {size:>6} {per:>9.2f} | {name:<8} {rate / 1e6:>8.1f} {ecb / per / 1e6:>9.1f} "
                  f"{vaes / per / 1e6:>10.1f} {rate * per / vaes if vaes else 0:>8.0%}")
    backend.set_threads(before)


def sycret_row(n: int) -> tuple[float, float] | None:
    try:
        import sycret
    except ImportError:
        return None
    le = sycret.LeFactory(n_threads=1)
    ka, _ = le.keygen(n)
    x = np.random.default_rng(1).integers(0, 2**31, n, dtype=np.int64)
    return n / best_of(lambda: le.keygen(n)), n / best_of(lambda: le.eval(0, x, ka))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-grid", action="store_true", help="skip the full grids (eval_sum at all 2^16 points, eval_grid)")
    ap.add_argument("--eval-grid", action="store_true", help="only the eval_grid section (and the AES peaks)")
    args = ap.parse_args()
    if args.eval_grid:
        ecb, vaes = ecb_blocks_per_s(), vaes_blocks_per_s()
        print(f"backend {backend.current()}; pycryptodome ECB {ecb / 1e6:.0f} M blocks/s, VAES peak {vaes / 1e6:.0f} M blocks/s per core")
        eval_grid_section(args.quick, ecb, vaes)
        return
    n = 50_000 if args.quick else 400_000
    cores = backend.threads()
    ecb, vaes = ecb_blocks_per_s(), vaes_blocks_per_s()
    print(f"backend {backend.current()}, {cores} cores; pycryptodome ECB {ecb / 1e6:.0f} M blocks/s, "
          f"VAES peak {vaes / 1e6:.0f} M blocks/s per core; n = {n} keys\n")
    head = f"{'bits':>4} {'out':>3} {'w':>1} {'key B':>6} {'mem/key':>7} | {'gen M/s':>7} | {'eval M/s':>8} {'ECB bound':>9} {'VAES peak':>9} {'of peak':>7} | {'sum M/s':>7}"
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(0)
    for bits in (16, 32, 64):
        for out_bits in (32, 64):
            for width in (1, 3):
                fn = DCF(bits, out_bits, width)
                p = fn.params
                alphas = rng.integers(0, 1 << min(bits, 63), n, dtype=np.uint64)
                xs = rng.integers(0, 1 << min(bits, 63), n, dtype=np.uint64)
                backend.set_threads(1)
                t_gen = best_of(lambda: fn.gen_batch(alphas, 1))
                k0, _ = fn.gen_batch(alphas, 1)
                t_eval = best_of(lambda: fn.eval_batch(k0, xs))
                backend.set_threads(cores)
                t_sum = best_of(lambda: fn.eval_sum(k0, [12345]))
                ev = n / t_eval
                print(f"{bits:>4} {out_bits:>3} {width:>1} {fn.key_size:>6} {k0.nbytes / n:>7.0f} | {n / t_gen / 1e6:>7.2f} | "
                      f"{ev / 1e6:>8.2f} {ecb / eval_blocks(p) / 1e6:>9.2f} {vaes / eval_blocks(p) / 1e6:>9.2f} "
                      f"{ev * eval_blocks(p) / vaes if vaes else 0:>7.0%} | {n / t_sum / 1e6:>7.1f}")
    backend.set_threads(1)
    syc = sycret_row(n)
    fn = DCF(32, 64, 1, cmp="le")
    alphas = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    k0, _ = fn.gen_batch(alphas, 1)
    ours = (n / best_of(lambda: fn.gen_batch(alphas, 1)), n / best_of(lambda: fn.eval_batch(k0, alphas)))
    print("\nsame task as sycret's LeFactory (32-bit, x <= alpha, one core):")
    print(f"{'':>10} {'gen M/s':>8} {'eval M/s':>8}")
    print(f"{'fss':>10} {ours[0] / 1e6:>8.2f} {ours[1] / 1e6:>8.2f}")
    if syc:
        print(f"{'sycret':>10} {syc[0] / 1e6:>8.2f} {syc[1] / 1e6:>8.2f}")
        print(f"{'ratio':>10} {ours[0] / syc[0]:>7.1f}x {ours[1] / syc[1]:>7.1f}x")
    else:
        print("(sycret not installed: pip install sycret)")
    backend.set_threads(cores)
    big = 100_000 if args.quick else 1_000_000
    kb, _ = DCF(32).gen_batch(rng.integers(0, 1 << 32, big, dtype=np.uint64), 1)
    print(f"\neval_sum of {big} keys at one point, {cores} cores: {best_of(lambda: DCF(32).eval_sum(kb, [7])) * 1e3:.0f} ms")
    if not args.no_grid:
        fn16 = DCF(16)
        m = 10_000 if args.quick else 100_000
        kg, _ = fn16.gen_batch(rng.integers(0, 1 << 16, m, dtype=np.uint64), 1)
        grid = np.arange(1 << 16)
        t = best_of(lambda: fn16.eval_sum(kg, grid), 1)
        floor = m * 3 * ((1 << 16) - 1) / (vaes * cores) if vaes else float("nan")
        print(f"eval_sum of {m} keys at all 2^16 thresholds, {cores} cores: {t:.2f} s "
              f"(VAES-peak floor for 3 blocks per node: {floor:.2f} s)")
        eval_grid_section(args.quick, ecb, vaes)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
