"""The one-key shortcuts (issue 45, one-key latency) give what the general paths give: `inputs.point`
of a Python int and `inputs.payloads` of one int equal the numpy path's values and raise its errors,
and `keys.to_groups` of one group equals the general layout."""
import numpy as np
import pytest

from fss import DCF, DPF, ParameterError, backend, inputs, testing
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
