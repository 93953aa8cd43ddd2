"""The error vocabulary of `dpcdf`."""


class DpcdfError(Exception):
    """Base class of every error raised by `dpcdf`."""


class ParameterError(DpcdfError, ValueError):
    """A parameter (epsilon, grid, mechanism, data) is invalid."""


class DomainError(DpcdfError, ValueError):
    """A value lies outside the grid's range in strict mode."""
