"""Speed of `fss` on every kernel tier this CPU has, next to that tier's own AES limit, pycryptodome's
ECB and sycret, all measured in the same run.

    python bench/bench_fss.py            # --quick for a smaller run; --no-table to skip the full table
                                         # of (bits, out_bits, width) on the auto tier; --eval-grid for the
                                         # eval_grid section alone (one key's latency: bench_one_key.py)

Per tier (`fss.backend.available()`: portable, aesni, vaes256 on AVX2 + VAES, vaes on AVX-512), one
core, CPU time of this process (`time.process_time`; the machine is shared, and wall time would
count other programs' turns on our core):

  peak     the tier's register-only AES rate: a numba loop of MMO (AES_K(x) xor x) over blocks kept
           in registers, with the tier's instructions (512-bit VAES, 256-bit VAES, 128-bit AES-NI);
           the best of a few register counts. The portable tier's limit is pycryptodome's ECB itself.
  ECB      pycryptodome AES-128-ECB on a 32 MiB buffer (blocks/s); "x ECB" = our rate divided by the
           ECB bound, i.e. ECB blocks/s divided by the AES blocks the operation needs.
  eval     DCF(32, out 64) `eval_batch`, one point per key: evals/s (64 blocks each)
  gen      the same function's `gen_batch`: key pairs/s (both parties' expansions, 256 blocks)
  sum      `eval_sum` at one point, one thread: keys/s (64 blocks each)
  grid     `eval_grid` of DCF(10, F_p, x >= alpha) over all 2^10 points: points/s (3 blocks each in key
           format 2, the default; the eval_grid section also times format 1, 4 blocks a point)
  sketch   the verified close's work per report at 2^10 (count): what round one runs on each batch of
           reports (`round_one.step`, a pass of `keys_per_pass` keys): `round_one.grid_values` (eval_grid
           of the task's keys over the grid) + `Check.round_one_sums` (round one and the histogram
           share's column sums in one pass; bench_verify.py, part 2): reports/s
  % peak   AES blocks/s the operation drives divided by the tier's peak
"""
from __future__ import annotations

import argparse
import os
import platform
import secrets
import time

import numpy as np
from Crypto.Cipher import AES
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from fss import DCF, backend
from fss import _aes as A
from fss._fused import _Ptr, _level_loop
from fss.params import TreeParams


def best_of(fn, reps: int = 3, cpu: bool = True) -> float:
    """Best time of `reps` runs after one warm-up: CPU time of this process (one thread busy) or,
    with cpu=False, wall time (for work spread over several threads)."""
    clock = time.process_time if cpu else time.perf_counter
    fn()
    best = float("inf")
    for _ in range(reps):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return best


def ecb_blocks_per_s() -> float:
    buf = np.zeros(32 << 20, np.uint8)
    out = np.empty_like(buf)
    c = AES.new(bytes(16), AES.MODE_ECB)
    return buf.size / 16 / best_of(lambda: c.encrypt(memoryview(buf), output=memoryview(out)), 5)


def _spin(tier: str, nregs: int, inline: bool):
    """A numba function (rk, iters, out): `iters` MMO rounds over `nregs` native registers of blocks,
    kept in registers; `inline`: the AVX2 tiers' inline-assembly rounds (`AesRounds._chunk`), else
    LLVM's own scheduling of the intrinsics."""

    @intrinsic
    def spin(typingctx, rk, iters, out):
        def codegen(context, b, signature, args):
            aes = A.AesRounds(b, _Ptr(context, b, signature.args[0], args[0]).data, tier)
            init = [ir.Constant(aes.native, [r] * (2 * aes.per)) for r in range(nregs)]

            def body(i, st):
                if aes.arm:  # AESE / AESMC (the aarch64 tier): LLVM schedules them
                    enc = aes.encrypt(list(st))
                elif inline and not aes.vaes:
                    enc = aes._chunk([b.xor(x, aes.keys[0]) for x in st], aes.keys[10])
                else:
                    enc = [b.xor(x, aes.keys[0]) for x in st]
                    for r in range(1, 10):
                        enc = [b.call(aes.enc, [x, aes.keys[r]]) for x in enc]
                    enc = [b.call(aes.last, [x, aes.keys[10]]) for x in enc]
                return [b.xor(e, x) for e, x in zip(enc, st)]

            final = _level_loop(b, args[1], init, body)
            acc = final[0]
            for v in final[1:]:
                acc = b.xor(acc, v)
            b.store(acc, b.bitcast(_Ptr(context, b, signature.args[2], args[2]).data, aes.native.as_pointer()), align=8)
            return context.get_dummy_value()

        return types.void(rk, types.int64, out), codegen

    @njit
    def run(rk, iters, out):
        spin(rk, iters, out)

    return run


def peak_blocks_per_s(tier: str, iters: int = 1_000_000) -> float:
    """The tier's register-only MMO rate (blocks/s), the best over a few register counts and both
    ways of emitting the rounds."""
    if tier == "portable":
        return ecb_blocks_per_s()
    per = A.TIERS[tier]
    out = np.zeros(8, np.uint64)
    best = 0.0
    shapes = [(12, False)] if tier == "vaes" else [(8, False), (12, False)] if tier == "aarch64" else [(8, True), (12, False)]
    for nregs, inline in shapes:
        run = _spin(tier, nregs, inline)
        best = max(best, iters * nregs * per / best_of(lambda: run(A.round_keys(), iters, out)))
    return best


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_cpu() -> str:
    from llvmlite import binding as llvm

    f = A.host_features()
    has = [x for x in ("aes", "avx2", "vaes", "avx512f", "neon") if x in f]
    target = os.environ.get("NUMBA_CPU_NAME")  # scripts/older_cpu.py: another CPU's code, run on this one
    llvm_name = f"{target} code on {llvm.get_host_cpu_name()}" if target else llvm.get_host_cpu_name()
    return f"{cpu_name()} ({A.machine()}, LLVM: {llvm_name}, {', '.join(has) or 'no AES instructions'})"


def eval_blocks(p: TreeParams) -> int:
    return p.bits * p.eval_blocks + (0 if p.width == 1 else p.value_blocks)


def gen_blocks(p: TreeParams) -> int:
    return 2 * (p.bits * p.expand_blocks + (0 if p.width == 1 else p.value_blocks))


def walk_blocks(p: TreeParams, size: int) -> int:
    """AES blocks of one key's eval_grid walk over a full grid of size = 2^bits points: the internal
    nodes' expansions and the leaves' LEAF blocks (`fss.portable.eval_grid`)."""
    return (size - 1) * p.expand_blocks + size * p.leaf_blocks


def grid_blocks(p: TreeParams, size: int) -> float:
    """AES blocks per point of eval_grid over a full grid of size = 2^bits points."""
    return walk_blocks(p, size) / size


class SketchWork:
    """The verified close's work per report at 2^10, count payload, as round one runs it on a batch of
    reports (`round_one.step`, bench_verify.py part 2): `round_one.pass_sums`, the grid walk of the
    task's keys (`TaskConfig.key_dcf`: the check's payload with its MAC, width 2) with each key's values
    reduced in cache to what `Check.round_one_sums` needs (round one and the histogram share's column
    sums; `DCF.eval_grid_sums`)."""

    def __init__(self, n: int | None = None):
        from dpcdf.service.protocols.check import round_one
        from dpcdf.service.task import TaskConfig

        cfg = TaskConfig({"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 10}, 1.0, "path", "substitution", 1, ("a", "b"),
                         ("00", "01"), "00", payload="count", verify=True)
        # the keys' DCF: a verified task's keys may carry more than the released payload (`key_dcf`)
        self.dcf = cfg.key_dcf()
        self.check, self.size = cfg.check(), cfg.make_grid().size
        # one pass of round one (`round_one.keys_per_pass`: 1024 keys, 16 MiB of grid values). It was
        # 2048 keys, whose 32 MiB result glibc maps fresh for every call (above its mmap threshold):
        # about 14% of the time went to the kernel's page faults, which round one does not pay
        self.n = n = n or round_one.keys_per_pass(self.size, self.dcf.width)
        rng = np.random.default_rng(10)
        betas = 1 if self.dcf.width == 1 else np.ones((n, self.dcf.width), np.int64)  # the values do not change the work
        with backend.using("portable"):
            self.keys, _ = self.dcf.gen_batch(rng.integers(0, self.size, n), betas)
        self.extras = np.zeros((n, self.check.extras), np.uint64)
        self.ch = self.check.challenges(secrets.token_bytes(32), b"bench")
        self.pass_sums = round_one.pass_sums

    def __call__(self) -> None:
        self.pass_sums(self.dcf, self.check, 0, self.keys, self.extras, self.ch)


def tier_section(quick: bool, reps: int) -> dict:
    """The per-tier table; returns {tier: {"eval": evals/s, ...}} for the sycret comparison."""
    n = 40_000 if quick else 200_000
    rng = np.random.default_rng(0)
    fn = DCF(32, 64, 1)
    p = fn.params
    alphas = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    xs = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    with backend.using("portable"):
        keys, _ = fn.gen_batch(alphas, 1)
    fg = DCF(10, group="p61", cmp="ge")
    gn = 1000 if quick else 4000
    with backend.using("portable"):
        gkeys, _ = fg.gen_batch(rng.integers(0, 1024, gn), 1)
    sketch = SketchWork()
    per_eval, per_gen, per_grid = eval_blocks(p), gen_blocks(p), grid_blocks(fg.params, 1024)
    before = backend.threads()
    backend.set_threads(1)
    ecb = ecb_blocks_per_s()
    print(f"pycryptodome AES-128-ECB: {ecb / 1e6:.0f} M blocks/s (bounds: eval {ecb / per_eval / 1e6:.2f} M/s, "
          f"gen {ecb / per_gen / 1e6:.2f} M/s, grid {ecb / per_grid / 1e6:.1f} M points/s)\n")
    head = f"{'tier':<8} {'peak':>6} | {'eval M/s':>8} {'%pk':>4} {'xECB':>5} | {'gen M/s':>7} {'%pk':>4} {'xECB':>5} | {'sum M/s':>7} {'%pk':>4} {'xECB':>5} | {'grid Mpt/s':>10} {'%pk':>4} {'xECB':>5} | {'sketch rep/s':>12}"  # noqa: E501
    print(head)
    print("-" * len(head))
    results = {}
    for name in reversed(backend.available()):
        peak = ecb if name == "portable" else peak_blocks_per_s(name)
        r = reps if name != "portable" else 1  # the portable tier's gen, grid and sketch take seconds: one run
        with backend.using(name):
            rates = {
                "eval": n / best_of(lambda: fn.eval_batch(keys, xs), reps),
                "gen": n / best_of(lambda: fn.gen_batch(alphas, 1), r),
                "sum": n / best_of(lambda: fn.eval_sum(keys, [12345]), reps),
                "grid": gn * 1024 / best_of(lambda: fg.eval_grid(gkeys, 1024), r),
                "sketch": sketch.n / best_of(sketch, r),
            }
        results[name] = rates
        cells = []
        for key, per in (("eval", per_eval), ("gen", per_gen), ("sum", per_eval), ("grid", per_grid)):
            blocks = rates[key] * per
            width = 10 if key == "grid" else 8 if key == "eval" else 7
            cells.append(f"{rates[key] / 1e6:>{width}.2f} {blocks / peak:>4.0%} {blocks / ecb:>5.2f}")
        print(f"{name:<8} {peak / 1e6:>6.0f} | " + " | ".join(cells) + f" | {rates['sketch']:>12,.0f}", flush=True)
    backend.set_threads(before)
    print("\npeak: M blocks/s (the portable tier: the ECB rate); %pk: AES blocks driven / peak; xECB: / the ECB bound")
    return results


def sycret_rates(n: int) -> tuple[float, float] | None:
    try:
        import sycret
    except ImportError:
        return None
    le = sycret.LeFactory(n_threads=1)
    ka, _ = le.keygen(n)
    x = np.random.default_rng(1).integers(0, 2**31, n, dtype=np.int64)
    return n / best_of(lambda: le.keygen(n)), n / best_of(lambda: le.eval(0, x, ka))


def sycret_section(quick: bool) -> None:
    n = 50_000 if quick else 200_000
    syc = sycret_rates(n)
    fn = DCF(32, 64, 1, cmp="le")
    alphas = np.random.default_rng(5).integers(0, 1 << 32, n, dtype=np.uint64)
    print("\nsame task as sycret's LeFactory (32-bit, x <= alpha, one core):")
    print(f"{'':>16} {'gen M/s':>8} {'eval M/s':>8}" + ("" if syc is None else f" {'gen x':>6} {'eval x':>6}"))
    if syc:
        print(f"{'sycret':>16} {syc[0] / 1e6:>8.2f} {syc[1] / 1e6:>8.2f}")
    before = backend.threads()
    backend.set_threads(1)
    for name in reversed(backend.available()):
        with backend.using(name):
            k0, _ = fn.gen_batch(alphas, 1)
            ours = (n / best_of(lambda: fn.gen_batch(alphas, 1)), n / best_of(lambda: fn.eval_batch(k0, alphas)))
        ratio = "" if syc is None else f" {ours[0] / syc[0]:>5.1f}x {ours[1] / syc[1]:>5.1f}x"
        print(f"{'fss ' + name:>16} {ours[0] / 1e6:>8.2f} {ours[1] / 1e6:>8.2f}{ratio}")
    backend.set_threads(before)
    if syc is None:
        print("(sycret not installed: pip install sycret)")


def full_table(quick: bool) -> None:
    """gen, eval and eval_sum (all cores, wall time) over (bits, out_bits, width) on the auto tier."""
    n = 50_000 if quick else 400_000
    cores = backend.threads()
    name = backend.current()
    peak = ecb_blocks_per_s() if name == "portable" else peak_blocks_per_s(name)
    print(f"\nfull table, tier {name} (peak {peak / 1e6:.0f} M blocks/s), n = {n} keys; gen and eval one core, sum {cores} cores")
    head = f"{'bits':>4} {'out':>3} {'w':>1} {'key B':>6} | {'gen M/s':>7} | {'eval M/s':>8} {'of peak':>7} | {'sum M/s':>7}"
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(0)
    for bits in (16, 32, 64):
        for out_bits in (32, 64):
            for width in (1, 3):
                fn = DCF(bits, out_bits, width)
                alphas = rng.integers(0, 1 << min(bits, 63), n, dtype=np.uint64)
                xs = rng.integers(0, 1 << min(bits, 63), n, dtype=np.uint64)
                backend.set_threads(1)
                t_gen = best_of(lambda: fn.gen_batch(alphas, 1))
                k0, _ = fn.gen_batch(alphas, 1)
                t_eval = best_of(lambda: fn.eval_batch(k0, xs))
                backend.set_threads(cores)
                t_sum = best_of(lambda: fn.eval_sum(k0, [12345]), cpu=False)
                ev = n / t_eval
                print(f"{bits:>4} {out_bits:>3} {width:>1} {fn.key_size:>6} | {n / t_gen / 1e6:>7.2f} | "
                      f"{ev / 1e6:>8.2f} {ev * eval_blocks(fn.params) / peak:>7.0%} | {n / t_sum / 1e6:>7.1f}")


def eval_grid_section(quick: bool) -> None:
    """eval_grid of the servers' functions (DCF over F_p, x >= alpha) on one core, on every tier."""
    ecb = ecb_blocks_per_s()
    peaks = {name: (ecb if name == "portable" else peak_blocks_per_s(name)) for name in backend.available()}
    print(f"\neval_grid, one core (ECB {ecb / 1e6:.0f} M blocks/s): every key's shares at every point")
    head = f"{'function':<50} {'keys':>6} {'points':>6} {'blocks/pt':>9} | {'tier':<8} {'M pts/s':>8} {'x ECB':>6} {'of peak':>7}"
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(3)
    before = backend.threads()
    backend.set_threads(1)
    for fn, n in ((DCF(10, group="p61", cmp="ge"), 10_000), (DCF(10, group="p61", cmp="ge", version=1), 10_000),
                  (DCF(10, width=2, group="p61", cmp="ge"), 10_000), (DCF(10, width=2, group="p61", cmp="ge", version=1), 10_000),
                  (DCF(16, group="p61", cmp="ge"), 200)):
        n = n // 5 if quick else n
        size = 1 << fn.bits
        with backend.using("portable"):
            k0, _ = fn.gen_batch(rng.integers(0, size, n), 1)
        per = grid_blocks(fn.params, size)
        for i, name in enumerate(reversed(backend.available())):
            with backend.using(name):
                t = best_of(lambda: fn.eval_grid(k0, size), 1 if name == "portable" else 3)
            rate = n * size / t
            label = repr(fn).replace("out_bits=61, ", "") if i == 0 else ""
            print(f"{label:<50} {n:>6} {size:>6} {per:>9.2f} | {name:<8} {rate / 1e6:>8.1f} {rate * per / ecb:>6.2f} "
                  f"{rate * per / peaks[name]:>7.0%}")
    backend.set_threads(before)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-table", action="store_true", help="skip the full (bits, out_bits, width) table on the auto tier")
    ap.add_argument("--eval-grid", action="store_true", help="only the eval_grid section, on every tier")
    ap.add_argument("--reps", type=int, default=3, help="runs per measurement (best of)")
    args = ap.parse_args()
    print(f"CPU: {describe_cpu()}; tiers {', '.join(backend.available())} (auto: {backend.current()}); "
          f"one core, CPU time\n")
    if args.eval_grid:
        eval_grid_section(args.quick)
        return
    tier_section(args.quick, args.reps)
    sycret_section(args.quick)
    eval_grid_section(args.quick)
    if not args.no_table:
        full_table(args.quick)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
