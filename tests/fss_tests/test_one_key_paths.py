"""The one-key shortcuts (issue 45, one-key latency) give what the general paths give: `inputs.point`
of a Python int and `inputs.payloads` / `inputs.payload` of one int equal the numpy path's values and
raise its errors, `keys.to_groups` of one group equals the general layout, and one key's gen
(`fast.gen_one`) gives `gen_batch`'s bytes on every tier, from any thread, leaving no seed behind."""
import secrets
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fss import DCF, DPF, ParameterError, backend, fast, inputs, testing
from fss.keys import GROUP, to_groups

FUNCTIONS = [DCF(1), DCF(8, 8, signed=True), DCF(32, cmp="ge"), DCF(64, 64, 2, cmp="gt", signed=True), DPF(16, 20),
             DCF(63, 1, signed=True), DPF(64, 64), DCF(12, group="p61")]


def _edges(lo, hi):
    return sorted({lo - 1, lo, lo + 1, -1, 0, 1, hi - 1, hi, hi + 1, (lo + hi) // 2, -(1 << 64), 1 << 64})


def _outcome(call):
    try:
        return call()
    except ParameterError as exc:
        return ("error", str(exc))


@pytest.mark.parametrize("fn", FUNCTIONS, ids=repr)
def test_point_of_an_int_is_the_general_path(fn):
    p = fn.params
    lo, hi = p.domain_range()
    rng = np.random.default_rng(p.bits)
    xs = _edges(lo, hi) + [int(v) for v in rng.integers(lo, hi, 50, endpoint=True, dtype=np.int64 if lo < 0 else np.uint64)]
    for x in xs:
        fast = _outcome(lambda: inputs.point(p, x, "alpha"))
        general = _outcome(lambda: int(inputs.points(p, np.array(x, dtype=object), "alpha")))
        assert fast == general, x
        assert type(fast) is (tuple if isinstance(general, tuple) else int)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=repr)
def test_payload_of_an_int_is_the_general_path(fn):
    p = fn.params
    lo, hi = (-(p.modulus - 1), p.modulus - 1) if p.prime else (-(1 << (p.out_bits - 1)), p.mask)
    for beta in _edges(lo, hi):
        for n in (1, 3):
            fast = _outcome(lambda: inputs.payloads(p, beta, n))
            general = _outcome(lambda: inputs.payloads(p, np.array(beta, dtype=object), n))
            if isinstance(general, tuple):
                assert fast == general, beta
            else:
                assert fast.dtype == general.dtype and fast.shape == general.shape and np.array_equal(fast, general), beta
                assert fast.flags.c_contiguous and fast.flags.writeable


@pytest.mark.parametrize("shape,dtype", [((2, 1), np.uint64), ((5, 2, 7), np.uint64), ((3, 16), np.uint8), ((1, 2, 1), np.uint32)])
def test_one_group_layout(shape, dtype):
    a = np.arange(np.prod(shape), dtype=np.uint64).reshape(shape).astype(dtype)
    n = shape[-1]
    padded = np.zeros(shape[:-1] + (GROUP,), dtype)
    padded[..., :n] = a
    want = np.ascontiguousarray(np.moveaxis(padded.reshape(shape[:-1] + (1, GROUP)), -2, 0))
    got = to_groups(a)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want) and got.flags.c_contiguous


@pytest.mark.parametrize("tier", sorted({"portable", backend.available()[-1]}))
@pytest.mark.parametrize("n", [1, 16, 17])
def test_gens_key_arrays_read_only_and_seeds_apart(tier, n):
    """The one-group gen hands each party a copy of its own seeds (never a view that reaches the other's)
    and read-only arrays, with the bytes of the portable backend."""
    fn = DCF(20, 32)
    with backend.using(tier):
        k0, k1 = testing.gen_batch(fn, np.arange(n) * 977, 3, seed=n)
    with backend.using("portable"):
        w0, w1 = testing.gen_batch(fn, np.arange(n) * 977, 3, seed=n)
    assert (k0.to_bytes(), k1.to_bytes()) == (w0.to_bytes(), w1.to_bytes())
    assert not np.shares_memory(k0.seeds, k1.seeds)
    for k in (k0, k1):
        assert not any(getattr(k, a).flags.writeable for a in ("seeds", "cw_seed", "cw_t", "cw_v"))


@pytest.mark.parametrize("fn", FUNCTIONS, ids=repr)
def test_one_payload_is_the_general_path(fn):
    """`inputs.payload` (one key's, an int where it can) is `payloads(p, beta, 1)[0]`, errors included."""
    p = fn.params
    lo, hi = (-(p.modulus - 1), p.modulus - 1) if p.prime else (-(1 << (p.out_bits - 1)), p.mask)
    for beta in _edges(lo, hi) + ([[1] * fn.width, [lo] * fn.width] if fn.width > 1 else [np.int64(3)]):
        one = _outcome(lambda: inputs.payload(p, beta))
        general = _outcome(lambda: inputs.payloads(p, beta, 1)[0])
        if isinstance(general, tuple):
            assert one == general, beta
        else:
            assert np.array_equal(np.broadcast_to(np.asarray(one, np.uint64), general.shape), general), beta


GEN_FUNCTIONS = FUNCTIONS + [DCF(16, 64, 3), DCF(10, 32, 8, cmp="ge"), DCF(9, 16, 9), DPF(12, 40, 5)]


@pytest.mark.parametrize("tier", backend.available())
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_one_keys_gen_is_the_batchs_on_every_tier(tier, data):
    """`gen` (one key: `fast.gen_one` on the fused tiers) and `gen_batch` of that one key give the same
    bytes for the same randomness, across functions (widths 1 to 9, 32-bit payloads, F_p, signed),
    alphas at the domain's edges and payloads."""
    fn = data.draw(st.sampled_from(GEN_FUNCTIONS), "fn")
    p = fn.params
    lo, hi = p.domain_range()
    alpha = data.draw(st.one_of(st.sampled_from([lo, hi, 0 if lo <= 0 else lo]), st.integers(lo, hi)), "alpha")
    top = p.modulus - 1 if p.prime else p.mask
    beta = data.draw(st.lists(st.integers(0, top), min_size=fn.width, max_size=fn.width), "beta")
    randomness = data.draw(st.binary(min_size=32, max_size=32), "randomness")
    with backend.using(tier):
        k0, k1 = fn._gen_with_randomness(alpha, beta if fn.width > 1 else beta[0], randomness)
        b0, b1 = fn._gen_batch_with_randomness(np.array([alpha], dtype=object), np.array([beta], dtype=object), randomness)
    assert (k0.to_bytes(), k1.to_bytes()) == (b0[0].to_bytes(), b1[0].to_bytes())
    assert not np.shares_memory(k0.batch.seeds, k1.batch.seeds)


def test_one_keys_gen_from_many_threads_leaves_no_seed_staged():
    """Threads generating at once each get correct keys (each reconstructs its own comparison), and
    nothing secret (root seeds, alpha, the payload) stays in any thread's staging arrays
    (`fast._staging`) once gen returns."""
    fn, errors = DCF(24, 64, cmp="le"), []
    tier = backend.available()[-1]

    def work(k: int) -> None:
        with backend.using(tier):
            for _ in range(200):
                alpha = secrets.randbelow(1 << 24)
                k0, k1 = fn.gen(alpha, k + 1)
                got = (fn.reconstruct(fn.eval(k0, alpha), fn.eval(k1, alpha)), fn.reconstruct(fn.eval(k0, alpha + 1), fn.eval(k1, alpha + 1))) \
                    if alpha + 1 < (1 << 24) else (k + 1, 0)
                if got != (k + 1, 0):
                    errors.append((k, alpha, got))
            staged = getattr(fast._one, "staged", {})
            if tier != "portable" and (1 not in staged or staged[1].any()):
                errors.append((k, "a seed, alpha or payload left in staging"))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("tier", [t for t in backend.available() if t != "portable"])
@pytest.mark.parametrize("fn", [DCF(32, 64), DCF(16, 20, 3), DPF(12, 64, 2)], ids=repr)
def test_neither_key_reaches_the_other_partys_seed(tier, fn):
    """Review of the one-key kernel: each party's key arrays, and the arrays they are views of, share no
    memory with the other party's seed (an earlier version kept both seeds in one allocation that each
    key's corrections were views of); all of them are read-only. And `fast.gen_one` refuses randomness that
    is not 32 bytes (its kernel reads four words)."""
    with backend.using(tier):
        k0, k1 = fn.gen(5, 1 if fn.width == 1 else list(range(1, fn.width + 1)))
    for mine, theirs in ((k0.batch, k1.batch), (k1.batch, k0.batch)):
        for a in (mine.seeds, mine.cw_seed, mine.cw_t, mine.cw_v):
            assert not a.flags.writeable
            for b in (a, a.base):
                assert b is None or not np.shares_memory(b, theirs.seeds)
    with pytest.raises(ParameterError, match="32 bytes"):
        fast.gen_one(fn.params, 5, 1, bytes(24), tier)
