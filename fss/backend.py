"""Which implementation evaluates keys: the fused kernels on the CPU's AES instructions, or the
portable level-by-level backend. All give bit-identical results (the tests pin them together).

    fss.backend.available()        # e.g. ('portable', 'aesni', 'vaes256') on AVX2 + VAES
    fss.backend.set_backend("portable")   # the process-wide default; or FSS_BACKEND=portable in the environment
    with fss.backend.using("aesni"): ...  # this thread (this context) only, for the block
    fss.backend.set_threads(2)     # threads of the fused kernels, for calls from this thread only
    fss.backend.info()             # the choice, the tiers, and whether pycryptodome's fast ECB path is active

Scope: `set_backend` sets the process-wide default, which every thread sees unless it is inside a
`using` block. `using` sets the choice in a `contextvars.ContextVar`: it applies to the calling thread
(or asyncio task) for the block and never to another thread. A new `threading.Thread` starts from
the process-wide default (Python threads do not inherit context variables); to carry a block's
choice into one, run its target in `contextvars.copy_context().run`. `set_threads` is per thread too
(numba keeps its thread count per thread): see its docstring.

The tiers, one per instruction set (`available()` lists those this CPU has, slowest first):
  "portable"  level by level, one pycryptodome ECB call per level (any CPU);
  "aesni"     fused kernels on 128-bit AES-NI (any x86-64 with AES-NI);
  "vaes256"   fused kernels on 256-bit VAES with AVX2, two blocks per instruction (Intel Ice Lake /
              Alder Lake and later clients, AMD Zen 3);
  "vaes"      fused kernels on 512-bit VAES with AVX-512, four blocks per instruction;
  "aarch64"   fused kernels on the ARMv8 crypto extension (AESE + AESMC on 128-bit NEON registers), any
              aarch64 CPU with the "aes" feature (Apple M1 and later, AWS Graviton, Ampere Altra, most Cortex-A).
"auto" (the default) picks the fastest of them ("vaes", else "vaes256", else "aesni", else "aarch64",
else "portable"),
and runs a self-test of the fused kernel against the portable backend before trusting it. Payload widths above
`fast.MAX_WIDTH` always take the portable backend, and so do prime-field keys (group "p61") except
in `eval_grid` and `eval_grid_sums`, whose fused kernels (`fss._grid`, `fss._blockgrid`, `fss._gridsums`)
also do the F_p arithmetic (and have their own self-tests per width, DCF or DPF, group and sketch shape).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import warnings
from typing import TYPE_CHECKING, Iterator

from ._lazy import numpy as _numpy

from .errors import FssError, ParameterError
from .keys import KeyBatch
from .params import TreeParams, check_int

if TYPE_CHECKING:
    import numpy as np
else:
    np = _numpy(__name__)  # numpy at first use (`fss._lazy`)

# Nothing here imports numba, llvmlite or the kernels at module level (nor numpy: `fss._lazy`), so that
# `import fss` stays cheap; the first call that needs a kernel (gen, eval, `available()`, `current()`,
# `set_threads`) imports them. `_portable()` imports the portable backend.


def _portable():
    from . import portable

    return portable

NAMES = ("auto", "portable", "aarch64", "aesni", "vaes256", "vaes")
FUSED = ("aarch64", "aesni", "vaes256", "vaes")  # slowest first (aarch64 and the x86 tiers exclude each other)
_default = os.environ.get("FSS_BACKEND", "auto")  # the process-wide choice: FSS_BACKEND, then set_backend
_scoped: contextvars.ContextVar[str | None] = contextvars.ContextVar("fss_backend", default=None)  # using()


def chosen() -> str:
    """The backend name in force for the caller ("auto" not resolved: `current()` resolves it): the
    innermost `using` block of this thread or task, else the process-wide default."""
    name = _scoped.get()
    return _default if name is None else name


@functools.lru_cache(maxsize=None)
def available() -> tuple[str, ...]:
    """The backends this CPU can run (asks LLVM for the CPU's features the first time; they do not
    change within a process, so the answer is kept: every gen and eval asks)."""
    from . import _aes

    return ("portable",) + tuple(name for name in FUSED if _aes.supported(name))


def _check_name(name: object) -> str:
    if not isinstance(name, str) or name not in NAMES:
        raise ParameterError(f"backend must be one of {NAMES}, got {name!r}")
    if name != "auto" and name not in available():
        raise ParameterError(f"this CPU cannot run the {name!r} backend (available: {available()})")
    return name


def set_backend(name: str) -> None:
    """Sets the process-wide default backend, for every later call of every thread that is not
    inside a `using` block (such a block keeps its own choice until it ends). ParameterError for an
    unknown name or one the CPU cannot run."""
    global _default
    _default = _check_name(name)


@contextlib.contextmanager
def using(name: str) -> Iterator[None]:
    """Runs a block with another backend in this thread (or asyncio task) only: the choice lives in a
    context variable, so other threads keep theirs, and the block's end restores the previous one.
    ParameterError (before the block runs) for an unknown name or one the CPU cannot run."""
    token = _scoped.set(_check_name(name))
    try:
        yield
    finally:
        _scoped.reset(token)


def set_threads(n: int) -> None:
    """Threads the fused kernels use for calls made from the calling thread: an int in 1 ..
    NUMBA_NUM_THREADS (the cores numba found), else ParameterError. It is numba's thread count
    (`numba.set_num_threads`), which numba's threading layer keeps per thread: it applies to the
    calling thread only, each kernel call reads the count of the thread that makes it, and every
    other thread, including threads started later, keeps its own (numba's default is
    NUMBA_NUM_THREADS) until it calls `set_threads` itself. It is not scoped to a `using` block."""
    import numba

    cores = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # numba.config sets its options at import
    numba.set_num_threads(check_int("threads", n, 1, cores))


def threads() -> int:
    import numba

    return numba.get_num_threads()


def info() -> dict:
    """What this process runs on, for logs and bug reports (cheap: no kernel is compiled or self-tested):
    "backend" (`chosen()`, "auto" not resolved), "available" (the tiers this CPU can run), "threads",
    "fast_ecb" (whether the portable backend calls pycryptodome's C ECB routine directly, `fss.prg`)
    "fast_ecb_error" (what failed when it does not: the portable eval is then slower, same bits) and
    "cache_dir" (the folder of the compiled kernels' on-disk cache, `fss._cache`; None if not cached)."""
    from . import _cache, _kernels, prg

    return {"backend": chosen(), "available": available(), "threads": threads(), "fast_ecb": prg.fast_ecb(),
            "fast_ecb_error": prg.fast_ecb_error(), "cache_dir": _cache.cache_dir(_kernels.sum_columns)}


@functools.lru_cache(maxsize=None)
def _self_test(name: str) -> bool:
    """The fused kernels agree with the portable backend on a small DCF and DPF batch (gen and eval),
    called directly so that nothing here goes through the backend choice itself."""
    from . import fast, portable
    from .params import KIND_DCF, KIND_DPF

    for p in (TreeParams.make(KIND_DCF, 12, 64, 1, "le", False), TreeParams.make(KIND_DPF, 9, 40, 3, "eq", False)):
        n = 37
        alphas = np.arange(n, dtype=np.uint64) * np.uint64(97) % np.uint64(1 << p.bits)
        betas = np.full((p.width, n), 5, np.uint64)
        roots = (np.arange(4 * n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).reshape(2, 2, n)
        want0, _ = portable.gen_batch(p, alphas, betas, roots)
        got0, _ = fast.gen_batch(p, alphas, betas, roots, name)
        if got0.to_bytes() != want0.to_bytes():
            return False
        xs = alphas[::-1].copy()
        if not np.array_equal(fast.eval_batch(got0, xs, name), portable.eval_batch(want0, xs)):
            return False
    return True


def current() -> str:
    """The backend calls use now ("auto" resolved). A name from FSS_BACKEND that is unknown or that
    this CPU cannot run raises ParameterError here (the kernels never emit instructions the CPU lacks)."""
    name = chosen()
    if name != "auto":
        if name not in available():
            raise ParameterError(f"FSS_BACKEND={name!r}: backend must be one of {NAMES} and run on this CPU "
                                 f"(available: {available()})")
        return name
    for name in reversed(FUSED):
        if name in available():
            if _self_test(name):
                return name
            warnings.warn(f"fss: the {name} kernel failed its self-test; using the next backend", RuntimeWarning)
    return "portable"


def _fast_for(p: TreeParams) -> str | None:
    """The fused tier that runs `p`'s keys now, None for the portable backend."""
    return _fast_name(chosen(), p.prime, p.width)


@functools.lru_cache(maxsize=64)
def _fast_name(choice: str, prime: bool, width: int) -> str | None:
    """`_fast_for` once per (choice, prime, width): a few microseconds a call, most of one key's latency
    otherwise (a failed self-test raises, and exceptions are not cached)."""
    if prime and choice == "auto":  # the portable backend's, whatever the tier: no kernel to choose or self-test
        return None
    name = current()
    if name == "portable" or width > _fast().MAX_WIDTH or prime:
        return None
    if choice != "auto" and not _self_test(name):
        raise FssError(f"the {name} kernel failed its self-test against the portable backend")
    return name


@functools.lru_cache(maxsize=None)
def _fast():
    from . import fast  # numba's kernels: imported at first use (`import fss` stays light)

    return fast


def eval_batch(batch: KeyBatch, xs: np.ndarray) -> np.ndarray:
    """(width, n) shares of key k at internal point xs[k]."""
    name = _fast_for(batch.params)
    if name is None:
        return _portable().eval_batch(batch, xs)
    return _fast().eval_batch(batch, xs, name)


def eval_sum(batch: KeyBatch, points: np.ndarray) -> np.ndarray:
    """(m, width) sums over all keys at each internal point."""
    name = _fast_for(batch.params)
    if name is None:
        return _portable().eval_sum(batch, points)
    return _fast().eval_sum(batch, points, name, threads())


def gen_batch(p: TreeParams, alphas: np.ndarray, betas: np.ndarray, roots: np.ndarray) -> tuple[KeyBatch, KeyBatch]:
    """Key pairs for internal alphas (n,), payloads (width, n) and root seeds (2, 2, n)."""
    name = _fast_for(p)
    if name is None:
        return _portable().gen_batch(p, alphas, betas, roots)
    return _fast().gen_batch(p, alphas, betas, roots, name)


def gen_one(p: TreeParams, alpha: int, beta, randomness: bytes) -> tuple[KeyBatch, KeyBatch]:
    """One key pair for internal `alpha`, payload `beta` (an int, or (width,) values: `inputs.payload`) and
    its 32 root-seed bytes (`gen_batch`'s layout): the fused tiers' one-key path (`fast.gen_one`), else
    `gen_batch` of one."""
    name = _fast_for(p)
    if name is None:
        roots = np.frombuffer(randomness, "<u8").astype(np.uint64).reshape(2, 2, 1)
        betas = np.broadcast_to(np.asarray(beta, np.uint64), (p.width,)).reshape(-1, 1).copy()
        return _portable().gen_batch(p, np.array([alpha], np.uint64), betas, roots)
    return _fast().gen_one(p, alpha, beta, randomness, name)


def _self_test_keys(width: int, has_v: bool, prime: int):
    """Both parties' keys of a small fixed batch (21 keys, 7 bits) for the grid kernels' self-tests;
    `prime`: 0 over the ring, else the F_p key format version (`fast.field_code`)."""
    from . import portable
    from .params import KIND_DCF, KIND_DPF

    p = TreeParams.make(KIND_DCF if has_v else KIND_DPF, 7, None if prime else 64, width, "le" if has_v else "eq",
                        False, "p61" if prime else "ring", prime or None)
    n = 21
    alphas = np.arange(n, dtype=np.uint64) * np.uint64(37) % np.uint64(1 << p.bits)
    betas = (np.arange(n * width, dtype=np.uint64).reshape(width, n) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(4)
    roots = (np.arange(4 * n, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)).reshape(2, 2, n)
    return portable.gen_batch(p, alphas, betas, roots)


@functools.lru_cache(maxsize=None)
def _sums_self_test(name: str, width: int, has_v: bool, c: int, offs: tuple, version: int = 2) -> bool:
    """The grid kernel with the row sketch of this shape (`_gridsums`) agrees with `_linear.sums_of` of
    the portable backend's grid values (both parties, a partial range in both orders, weights near p)."""
    from . import portable
    from ._gridsums import eval_grid_sums
    from ._linear import sums_of

    w = np.arange(len(offs) * 100 * c, dtype=np.uint64).reshape(len(offs), 100, c) * np.uint64(0x9E3779B97F4A7C15)
    w = np.uint64((1 << 61) - 2) - w % np.uint64((1 << 61) - 1 - 7)  # canonical, many near p
    o = np.array(offs, dtype=np.int64)
    for k in _self_test_keys(width, has_v, version):
        for start, reverse in ((0, False), (3, True)):
            got = eval_grid_sums(k, start, 100, reverse, name, w, o)
            want = sums_of(portable.eval_grid(k, start, 100, reverse), w, o)
            if not all(np.array_equal(a, b) for a, b in zip(got, want)):
                return False
    return True


@functools.lru_cache(maxsize=None)
def _grid_self_test(name: str, width: int, has_v: bool, prime: int) -> bool:
    """The grid kernel of this width, DCF or DPF and group agrees with the portable backend on a
    small batch (both parties, a partial range in both orders, every level of a 7-bit tree)."""
    from . import fast, portable

    for k in _self_test_keys(width, has_v, prime):
        for start, size, reverse in ((0, 128, False), (3, 100, True)):
            got = fast.eval_grid(k, start, size, reverse, name)
            if not np.array_equal(got, portable.eval_grid(k, start, size, reverse)):
                return False
    return True


def _grid_for(p: TreeParams) -> str | None:
    """The backend of `eval_grid` (its fused kernel also does F_p arithmetic): as `_fast_for`, but
    the test that counts is `_grid_self_test` of the kernel these parameters use (failing it gives
    a warning and the portable backend under "auto", an FssError for an explicit choice)."""
    fast = _fast()
    name = current()
    if name == "portable" or p.width > fast.MAX_WIDTH:
        return None
    return name if _trusted(name, "grid kernel", _grid_self_test(name, p.width, p.level_payload, fast.field_code(p))) else None


def _trusted(name: str, what: str, passed: bool) -> bool:
    """A fused kernel's self-test verdict: a failure is an FssError for a tier chosen by name, and a
    warning (the caller then takes the portable backend) under "auto"."""
    if not passed:
        if chosen() != "auto":
            raise FssError(f"the {name} {what} failed its self-test against the portable backend")
        warnings.warn(f"fss: the {name} {what} failed its self-test; using the portable backend", RuntimeWarning)
    return passed


def eval_grid(batch: KeyBatch, start: int, size: int, reverse: bool) -> np.ndarray:
    """(n, size, width) shares of every key at internal points start + j (or, with `reverse`,
    start + size - 1 - j) for j in 0 .. size - 1."""
    name = _grid_for(batch.params)
    if name is None:
        return _portable().eval_grid(batch, start, size, reverse)
    return _fast().eval_grid(batch, start, size, reverse, name, threads())


def eval_grid_sums(batch: KeyBatch, start: int, size: int, reverse: bool, weights: np.ndarray,
                   offs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_linear.sums_of` of `eval_grid`'s values (F_p only), on the grid kernel without its output array
    where there is one (`_gridsums.eval_grid_sums`)."""
    from ._linear import sums_of

    p = batch.params
    name = _grid_for(p)
    if name is not None and not _trusted(name, "grid kernel's sketch", _sums_self_test(
            name, p.width, p.level_payload, weights.shape[2], tuple(int(o) for o in offs), p.version)):
        name = None
    if name is None:
        return sums_of(_portable().eval_grid(batch, start, size, reverse), weights, offs)
    from ._gridsums import eval_grid_sums

    return eval_grid_sums(batch, start, size, reverse, name, weights, offs, threads())


def eval_full(batch: KeyBatch) -> np.ndarray:
    return _portable().eval_full(batch)


def warm_up(width: int = 1, out_bits: int = 64) -> None:
    """Compiles the kernels a workload of this payload width will use (gen, eval, eval_sum at one
    and at many points), so that the first real call does not pay numba's compile time. Their types
    do not depend on `bits`, so a small domain serves every task. Compiled kernels are kept on disk
    (`fss._cache`), so this costs a fraction of a second in every process after the first."""
    from .params import KIND_DCF

    p = TreeParams.make(KIND_DCF, 4, out_bits, width, "lt", False)
    xs = np.arange(20, dtype=np.uint64) % np.uint64(16)
    roots = np.arange(80, dtype=np.uint64).reshape(2, 2, 20)
    k0, _ = gen_batch(p, xs, np.ones((width, 20), np.uint64), roots)
    eval_batch(k0, xs)
    eval_sum(k0, np.array([3], np.uint64))
    eval_sum(k0, np.array([1, 5, 9], np.uint64))
    from . import codec

    codec.decode_grouped(p, k0.to_bytes())  # the batch codec's kernels (`fss._serial`)
