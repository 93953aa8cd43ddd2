import numpy as np
import pytest

from dpcdf import DomainError, Grid, ParameterError


def test_index_semantics():
    g = Grid.from_thresholds([0.0, 1.0, 2.5, 10.0])
    np.testing.assert_array_equal(g.index([-5, 0.0, 0.5, 1.0, 2.5, 2.6, 10.0, 11.0]), [0, 0, 1, 1, 2, 3, 3, 3])
    assert g.bits == 2 and g.size == 4


def test_strict_refuses_values_above_the_range_and_nan_always():
    g = Grid.uniform(0, 1, bits=3, strict=True)
    with pytest.raises(DomainError, match="above the grid's last threshold"):
        g.index([0.5, 2.0])
    with pytest.raises(DomainError, match="NaN"):
        Grid.uniform(0, 1, bits=3).index([np.nan])


def test_uniform_and_log_grids():
    u = Grid.uniform(-1, 1, bits=4)
    assert u.size == 16 and u.thresholds[0] == -1 and u.thresholds[-1] == 1
    lg = Grid.log(1, 1000, bits=3)
    np.testing.assert_allclose(np.diff(np.log(lg.thresholds)), np.log(1000) / 7)
    assert Grid.integers(10).index([3])[0] == 3


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: Grid.uniform(0, 1, bits=0), "bits must be an int in"),
        (lambda: Grid.uniform(0, 1, bits=25), "bits must be an int in"),
        (lambda: Grid.uniform(1, 1, bits=3), "need finite lo < hi"),
        (lambda: Grid.uniform(0, np.inf, bits=3), "need finite lo < hi"),
        (lambda: Grid.log(0, 1, bits=3), "lo > 0"),
        (lambda: Grid.from_thresholds([1, 1, 2]), "strictly increasing"),
        (lambda: Grid.from_thresholds([1]), "at least 2"),
        (lambda: Grid.from_thresholds([0, np.nan]), "finite"),
    ],
)
def test_bad_grids(build, message):
    with pytest.raises(ParameterError, match=message):
        build()
