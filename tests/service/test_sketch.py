"""The check's numba kernels (`dpcdf.service.verification.sketch`) against Python integers: every weighted sum
mod p, at sizes around the 128-bit accumulator's fold interval and with the largest field elements
(p - 1 everywhere is the case where an accumulator that took one product too many would wrap)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcdf.service.verification import sketch
from fss import field as F

P = F.P
FOLD = sketch.FOLD_EVERY
SIZES = st.sampled_from([1, 2, FOLD - 1, FOLD, FOLD + 1, 2 * FOLD, 3 * FOLD + 5, 100])


def field_array(data, shape: tuple[int, ...]) -> np.ndarray:
    """Field elements with the edge values 0, 1 and p - 1 over-represented, or all p - 1."""
    if data.draw(st.booleans(), label="all p - 1"):
        return np.full(shape, P - 1, np.uint64)
    elem = st.one_of(st.sampled_from([0, 1, P - 1]), st.integers(0, P - 1))
    flat = data.draw(st.lists(elem, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    return np.array(flat, dtype=np.uint64).reshape(shape)


def dot(a: np.ndarray, b: np.ndarray) -> int:
    return sum(int(x) * int(y) for x, y in zip(a.reshape(-1), b.reshape(-1))) % P


@settings(max_examples=60, deadline=None)
@given(data=st.data(), size=SIZES, width=st.integers(1, 3), n=st.integers(1, 4))
def test_sketch_is_the_weighted_sums_mod_p(data, size, width, n):
    y, wz, wl = field_array(data, (n, size, width)), field_array(data, (size, width)), field_array(data, (size, width))
    one = np.uint64(data.draw(st.sampled_from([0, 1])))
    z, l, top = sketch.sketch(y, wz, wl, one)
    for k in range(n):
        assert int(z[k]) == dot(y[k], wz)
        assert int(l[k]) == dot(y[k], wl)
        assert int(top[k]) == (int(one) - sum(int(v) for v in y[k, -1])) % P


@settings(max_examples=40, deadline=None)
@given(data=st.data(), size=SIZES, n=st.integers(1, 3))
def test_calibration_sketch_is_its_four_sums_mod_p(data, size, n):
    y, w = field_array(data, (n, size, 3)), field_array(data, (size, 5))
    res = sketch.sketch_calibration(y, w)
    for k in range(n):
        y0, y1, y2 = (y[k, :, c] for c in range(3))
        assert int(res[k, 0]) == (dot(y0, w[:, 0]) + dot(y1, w[:, 1])) % P
        assert int(res[k, 1]) == (dot(y0, w[:, 2]) + dot(y1, w[:, 3])) % P
        assert int(res[k, 2]) == dot(y0, w[:, 4])
        assert int(res[k, 3]) == dot(y2, w[:, 4])


def test_column_sums_mod_p():
    y = np.full((9, 5, 2), P - 1, np.uint64)
    y[3] = 0
    np.testing.assert_array_equal(sketch.column_sums(y), np.full((5, 2), (8 * (P - 1)) % P, np.uint64))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), size=SIZES, width=st.integers(1, 3), n=st.integers(1, 6), sums=st.booleans())
def test_the_fused_mac_sketch_is_its_five_sums_and_the_column_sums_mod_p(data, size, width, n, sums):
    """`sketch_mac` reads values and MAC tags in place from one (n, N, 2 width) array: z, l, top of the
    values, z and top (without the constant) of the tags, and optionally the values' column sums."""
    y, wz, wl = field_array(data, (n, size, 2 * width)), field_array(data, (size, width)), field_array(data, (size, width))
    one = np.uint64(data.draw(st.sampled_from([0, 1])))
    total = np.zeros(size * width if sums else 0, np.uint64)
    z, l, top, zt, topt = sketch.sketch_mac(y, width, wz, wl, one, total)
    vals, tags = y[:, :, :width], y[:, :, width:]
    for k in range(n):
        assert int(z[k]) == dot(vals[k], wz) and int(l[k]) == dot(vals[k], wl) and int(zt[k]) == dot(tags[k], wz)
        assert int(top[k]) == (int(one) - sum(int(v) for v in vals[k, -1])) % P
        assert int(topt[k]) == -sum(int(v) for v in tags[k, -1]) % P
    expected = [[sum(int(v) for v in vals[:, i, c]) % P for c in range(width)] for i in range(size)]
    if sums:
        assert total.reshape(size, width).tolist() == expected
    assert sketch.value_sums(y, width).tolist() == expected
    np.testing.assert_array_equal(sketch.value_sums(y, width), sketch.column_sums(np.ascontiguousarray(vals)))


def test_sums_of_many_reports_of_p_minus_1_fold_in_time():
    """Column sums over more rows than a uint64 holds of p - 1 without folding (the fold every 4 rows)."""
    y = np.full((37, 3, 2), P - 1, np.uint64)
    total = np.zeros(3, np.uint64)
    sketch.sketch_mac(y, 1, np.ones((3, 1), np.uint64), np.ones((3, 1), np.uint64), np.uint64(1), total)
    assert total.tolist() == [37 * (P - 1) % P] * 3 == sketch.value_sums(y, 1).reshape(-1).tolist()
