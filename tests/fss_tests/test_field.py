"""fss.field (F_p, p = 2^61 - 1) against Python's exact integers, including every edge value."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fss import field as F

P = F.P
EDGES = [0, 1, 2, P - 2, P - 1, (1 << 31) - 1, 1 << 31, (1 << 60) + 12345]
elems = st.lists(st.one_of(st.sampled_from(EDGES), st.integers(0, P - 1)), min_size=1, max_size=50)


def test_p_is_the_mersenne_prime():
    assert P == 2**61 - 1 and pow(3, P - 1, P) == 1 and all(P % q for q in (3, 5, 7, 11, 13, 31, 61))


@given(elems, elems)
def test_arithmetic_is_exact(xs, ys):
    n = min(len(xs), len(ys))
    a, b = np.array(xs[:n], np.uint64), np.array(ys[:n], np.uint64)
    assert F.mul(a, b).tolist() == [x * y % P for x, y in zip(xs, ys)]
    assert F.add(a, b).tolist() == [(x + y) % P for x, y in zip(xs, ys)]
    assert F.sub(a, b).tolist() == [(x - y) % P for x, y in zip(xs, ys)]
    assert F.neg(a).tolist() == [-x % P for x in xs[:n]]
    assert int(F.sum(a)) == sum(xs[:n]) % P and int(F.dot(a, b)) == sum(x * y for x, y in zip(xs, ys)) % P


@given(st.lists(st.integers(0, (1 << 128) - 1), min_size=1, max_size=50))
def test_wide_reduction(words):
    lo = np.array([w & ((1 << 64) - 1) for w in words], np.uint64)
    hi = np.array([w >> 64 for w in words], np.uint64)
    assert F.reduce128(lo, hi).tolist() == [w % P for w in words]
    assert F.reduce64(lo).tolist() == [(w & ((1 << 64) - 1)) % P for w in words]


def test_edges_and_signed_view():
    top = (1 << 128) - 1
    assert int(F.reduce128(np.uint64(top & ((1 << 64) - 1)), np.uint64(top >> 64))) == top % P
    assert F.signed(F.from_ints([-5, 5, 0, P // 2, P // 2 + 1])).tolist() == [-5, 5, 0, P // 2, -(P // 2)]
    big = np.full(1 << 12, P - 1, np.uint64)
    assert int(F.sum(big)) == ((P - 1) << 12) % P


@pytest.mark.parametrize("shape_a, shape_b", [((20000, 7), (7,)), ((1 << 14,), ()), ((300, 200), (300, 1)), ((1, 1 << 14), (3, 1))])
def test_large_arrays_run_one_loop_with_the_same_residues(shape_a, shape_b):
    """From `F.LOOP_MIN` elements add, sub and mul run as one numba loop (`fss._fieldk`): against
    Python integers, broadcasting as numpy does, with 0 and p - 1 among the values."""
    rng = np.random.default_rng(len(shape_a) + shape_a[-1])  # test data
    a = rng.integers(0, F.P, shape_a, dtype=np.uint64)
    b = rng.integers(0, F.P, shape_b, dtype=np.uint64) if shape_b else np.uint64(F.P - 1)
    a.reshape(-1)[:4] = [0, F.P - 1, 1, F.P - 1]
    shape = np.broadcast_shapes(a.shape, np.shape(b))
    assert int(np.prod(shape)) >= F.LOOP_MIN
    x = np.broadcast_to(a, shape).astype(object)
    y = np.broadcast_to(b, shape).astype(object)
    for name, want in (("add", (x + y) % F.P), ("sub", (x - y) % F.P), ("mul", (x * y) % F.P)):
        got = getattr(F, name)(a, b)
        assert got.shape == shape and got.dtype == np.uint64 and got.tolist() == want.tolist(), name
