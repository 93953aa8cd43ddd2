"""The error vocabulary of `dpcdf`."""


class DpcdfError(Exception):
    """Base class of every error raised by `dpcdf`."""


class ParameterError(DpcdfError, ValueError):
    """A parameter (epsilon, grid, mechanism, data) is invalid."""


class DomainError(DpcdfError, ValueError):
    """A value lies outside the grid's range in strict mode."""


class IntegerGridWarning(UserWarning):
    """Integer data on a grid whose thresholds miss some of its integers: F(t) at such an integer t is
    read at the threshold below it (`Grid.shifts_integers`, `Grid.integers(lo, hi)`)."""
