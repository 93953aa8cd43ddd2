"""Property tests up to bits = 64 and out_bits = 64: the fast path against the reference and the truth."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fss import reference as R

from helpers import add, as_rows, make

pytestmark = pytest.mark.usefixtures("each_backend")

KINDS = ("lt", "le", "gt", "ge", "eq")


@st.composite
def setups(draw, max_width=3):
    kind = draw(st.sampled_from(KINDS))
    bits = draw(st.one_of(st.integers(1, 64), st.sampled_from([1, 8, 32, 63, 64])))
    out_bits = draw(st.one_of(st.integers(1, 64), st.sampled_from([1, 32, 64])))
    width = draw(st.integers(1, max_width))
    signed = draw(st.booleans())
    fn = make(kind, bits, out_bits, width, signed)
    lo, hi = fn.params.domain_range()
    alpha = draw(st.one_of(st.sampled_from([lo, lo + 1, hi, 0 if signed else hi - 1]), st.integers(lo, hi)))
    alpha = min(max(alpha, lo), hi)
    beta = draw(st.lists(st.integers(-(1 << (out_bits - 1)), (1 << out_bits) - 1), min_size=width, max_size=width))
    randomness = draw(st.binary(min_size=32, max_size=32))
    return fn, alpha, beta, randomness


def _points(fn, alpha, extra):
    lo, hi = fn.params.domain_range()
    xs = {lo, hi, alpha, *extra}
    xs |= {v for v in (alpha - 1, alpha + 1) if lo <= v <= hi}
    return sorted(x for x in xs if lo <= x <= hi)


def _rowlist(fn, share):
    return list(share) if fn.width > 1 else [share]


@given(setups(), st.lists(st.integers(-(1 << 64), 1 << 64), max_size=4))
def test_single_key_matches_reference_and_truth(setup, extra):
    fn, alpha, beta, randomness = setup
    p = fn.params
    r0, r1 = R.gen(p, alpha, beta, int.from_bytes(randomness[:16], "little"), int.from_bytes(randomness[16:], "little"))
    k0, k1 = fn._gen_with_randomness(alpha, beta if fn.width > 1 else beta[0], randomness)
    assert k0.to_bytes() == R.encode(p, r0) and k1.to_bytes() == R.encode(p, r1)
    for x in _points(fn, alpha, extra):
        y0, y1 = fn.eval(k0, x), fn.eval(k1, x)
        assert _rowlist(fn, y0) == R.eval(p, r0, x)
        assert _rowlist(fn, y1) == R.eval(p, r1, x)
        assert _rowlist(fn, fn.reconstruct(y0, y1)) == R.function_value(p, alpha, beta, x)


@given(setups(), st.integers(1, 6), st.data())
def test_batch_paths_agree(setup, n, data):
    """eval == eval_batch; eval_sum == sum of eval_batch; keys survive both codecs."""
    fn, alpha, beta, _ = setup
    lo, hi = fn.params.domain_range()
    alphas = [alpha] + data.draw(st.lists(st.integers(lo, hi), min_size=n - 1, max_size=n - 1))
    xs = [data.draw(st.sampled_from(_points(fn, a, []))) for a in alphas]
    k0, k1 = fn.gen_batch(np.array(alphas, dtype=object), beta if fn.width > 1 else beta[0])
    batch0 = as_rows(fn, fn.eval_batch(k0, np.array(xs, dtype=object)))
    for i in range(n):
        assert _rowlist(fn, fn.eval(k0[i], xs[i])) == [int(v) for v in batch0[i]]
    # both codecs round-trip
    assert fn.batch_from_bytes(k0.to_bytes()).to_bytes() == k0.to_bytes()
    assert fn.key_from_bytes(k1[0].to_bytes()) == k1[0]
    # eval_sum over a few shared points
    pts = np.array(_points(fn, alpha, xs[:2]), dtype=object)
    sums = as_rows(fn, fn.eval_sum(k0, pts))
    for j, x in enumerate(pts):
        col = as_rows(fn, fn.eval_batch(k0, np.array([x] * n, dtype=object)))
        np.testing.assert_array_equal(sums[j], col.sum(axis=0, dtype=np.uint64) & np.uint64(fn.params.mask))
    total = add(fn, as_rows(fn, fn.eval_sum(k0, pts)), as_rows(fn, fn.eval_sum(k1, pts)))
    b = np.array([v % (1 << fn.out_bits) for v in beta], dtype=np.uint64)
    for j, x in enumerate(pts):
        hits = sum(1 for a in alphas if {"lt": x < a, "le": x <= a, "gt": x > a, "ge": x >= a, "eq": x == a}[fn.params.cmp])
        np.testing.assert_array_equal(total[j], (b * np.uint64(hits)) & np.uint64(fn.params.mask))


@given(setups(max_width=2))
def test_int64_and_uint64_arrays_are_accepted(setup):
    fn, alpha, beta, _ = setup
    lo, hi = fn.params.domain_range()
    dtype = np.int64 if fn.params.signed else np.uint64
    arr = np.array([alpha, lo, hi], dtype=dtype)
    k0, k1 = fn.gen_batch(arr, 1)
    y = add(fn, as_rows(fn, fn.eval_batch(k0, arr)), as_rows(fn, fn.eval_batch(k1, arr)))
    want = 1 if fn.params.cmp in ("le", "ge", "eq") else 0
    np.testing.assert_array_equal(y, np.full((3, fn.width), want, np.uint64))
