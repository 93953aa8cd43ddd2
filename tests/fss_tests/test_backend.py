"""The backends: selection, errors, and the fused kernels pinned bit for bit to the portable one."""
import os

import numpy as np
import pytest

from fss import DCF, DPF, FssError, ParameterError, backend, fast, portable


def test_selection_and_errors():
    assert backend.available()[0] == "portable"
    with backend.using("portable"):
        assert backend.current() == "portable"
    with pytest.raises(ParameterError, match="backend must be one of"):
        backend.set_backend("gpu")
    with pytest.raises(ParameterError, match="threads must lie in"):
        backend.set_threads(0)
    assert isinstance(FssError(), Exception)


@pytest.mark.skipif(backend.available() == ("portable",), reason="the CPU has no AES instructions: only the portable backend exists")
@pytest.mark.parametrize("fused", [n for n in backend.FUSED if n in backend.available()])
@pytest.mark.parametrize(
    "fn",
    [DCF(32), DCF(1), DCF(8, 16, 2, cmp="ge"), DCF(13, 64, 3, cmp="le", signed=True), DCF(64, 7, 4, cmp="gt"),
     DPF(10), DPF(9, 20, 4, signed=True), DCF(6, 64, 5), DCF(7, 33, 7, cmp="ge"), DPF(8, 64, 8)],
    ids=repr,
)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 100])
def test_fused_equals_portable(fused, fn, n):
    rng = np.random.default_rng(n)  # picks test points only
    top = min(fn.bits, 63)
    alphas = rng.integers(0, 1 << top, n, dtype=np.uint64)
    xs = rng.integers(0, 1 << top, n, dtype=np.uint64)
    xs[: n // 2] = alphas[: n // 2]  # on the path to alpha, all the way down
    for k in fn._gen_batch_with_randomness(alphas, -1, os.urandom(32 * n), internal=True):
        want = portable.eval_batch(k, xs)
        np.testing.assert_array_equal(fast.eval_batch(k, xs, fused), want)
        pts = np.unique(np.concatenate([xs[:3], [0, (1 << top) - 1]])).astype(np.uint64)
        np.testing.assert_array_equal(fast.eval_sum(k, pts, fused, 2), portable.eval_sum(k, pts))
        with backend.using(fused):
            np.testing.assert_array_equal(backend.eval_batch(k, xs), want)


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_count_does_not_change_sums(threads):
    fn = DCF(16)
    k0, k1 = fn.gen_batch(np.arange(1000) * 61 % 65536, 1)
    before = backend.threads()
    backend.set_threads(min(threads, before))
    try:
        got = fn.reconstruct(fn.eval_sum(k0, [0, 100, 30000]), fn.eval_sum(k1, [0, 100, 30000]))
    finally:
        backend.set_threads(before)
    want = [int(((np.arange(1000) * 61 % 65536) > x).sum()) for x in (0, 100, 30000)]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fn", [DCF(32, 64), DCF(32, 32), DCF(16, 64), DCF(64, 64), DCF(32, 64, 2)], ids=repr)
def test_key_batch_memory_is_within_5_percent_of_the_wire_size(fn):
    n = 1000
    k0, _ = fn.gen_batch(np.arange(n), 1)
    assert k0.nbytes <= 1.05 * n * fn.key_size


def test_tiers_follow_the_cpu_features():
    from fss import _aes

    have = backend.available()
    assert have[0] == "portable" and set(have) <= {"portable", *backend.FUSED}
    assert ("aesni" in have) == _aes.has_aesni()
    assert ("vaes256" in have) == _aes.has_vaes256()  # AVX2 + VAES: two blocks per instruction
    assert ("vaes" in have) == _aes.has_vaes512()  # AVX-512 + VAES: four
    assert ("aarch64" in have) == _aes.has_aarch64_aes()  # ARMv8 crypto extension (AESE / AESMC)
    assert not ("aarch64" in have and "aesni" in have)
    order = [n for n in backend.FUSED if n in have]
    assert list(have[1:]) == order  # slowest first; "auto" takes the last one that passes its self-test
    assert backend.current() in have


@pytest.mark.parametrize("tier", [n for n in backend.FUSED if n not in backend.available()] or ["none-missing"])
def test_a_tier_the_cpu_lacks_is_refused_with_a_typed_error(tier):
    if tier == "none-missing":  # this CPU has every tier: check the unknown name instead
        tier = "avx1024"
    fn = DCF(8)
    k0, _ = fn.gen_batch(np.arange(3), 1)
    with pytest.raises(ParameterError):
        backend.set_backend(tier)
    with pytest.raises(FssError):  # the kernels are never compiled for instructions the CPU lacks
        fast.eval_batch(k0, np.arange(3, dtype=np.uint64), tier)


def test_the_environment_variable_forces_a_tier():
    """FSS_BACKEND picks the tier at import; a name this CPU cannot run is a ParameterError at the first call."""
    import subprocess
    import sys

    code = "from fss import DCF, backend; k, _ = DCF(8).gen_batch([3], 1); print(backend.current())"
    for name in backend.available():
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FSS_BACKEND": name}, capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == name, out.stderr
    bad = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FSS_BACKEND": "avx1024"}, capture_output=True, text=True)
    assert bad.returncode != 0 and "ParameterError" in bad.stderr and "FSS_BACKEND" in bad.stderr


@pytest.mark.parametrize("fn", [DCF(32), DCF(20, 32), DCF(12, 64, 3, cmp="ge"), DPF(16, 32, 2)], ids=repr)
def test_portable_eval_over_several_chunks_is_the_function(fn):
    """The portable eval walks the keys a chunk of `portable.CHUNK_GROUPS` groups at a time, one fused
    level step per ECB call (a partial last group padded): two chunks and a partial one, against the
    function itself."""
    n = 2 * portable.CHUNK_GROUPS * 16 + 37
    rng = np.random.default_rng(7)
    alphas = rng.integers(0, 1 << fn.bits, n, dtype=np.uint64)
    xs = rng.integers(0, 1 << fn.bits, n, dtype=np.uint64)
    xs[::3] = alphas[::3]
    xs[1::7] = alphas[1::7] - 1 * (alphas[1::7] > 0)
    beta = [5] * fn.width if fn.width > 1 else 5
    with backend.using("portable"):
        k0, k1 = fn.gen_batch(alphas, beta)
        got = fn.reconstruct(fn.eval_batch(k0, xs), fn.eval_batch(k1, xs))
    if fn.params.cmp == "eq":
        hit = xs == alphas
    else:
        hit = (xs >= alphas) if fn.params.cmp == "ge" else (xs < alphas)
    want = np.where(hit, 5, 0)
    np.testing.assert_array_equal(got.reshape(n, -1), np.broadcast_to(want[:, None], (n, fn.width)))
