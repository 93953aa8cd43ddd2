"""fss.field (F_p, p = 2^61 - 1) against Python's exact integers, including every edge value."""
import numpy as np
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
