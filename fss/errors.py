"""The error vocabulary of `fss`: every failure a caller can provoke is one of these."""


class FssError(Exception):
    """Base class of every error raised by `fss`."""


class ParameterError(FssError, ValueError):
    """A parameter, input point, alpha or payload is out of range or of the wrong type."""


class KeyFormatError(FssError, ValueError):
    """Bytes that do not decode to a key of the expected kind, version, party and parameters."""


class KeyMismatchError(FssError, ValueError):
    """A key (or batch) used with a function of other parameters, or batches of different parties mixed."""


class KeyIndexError(ParameterError, IndexError):
    """A key index outside a `KeyBatch`. Also an `IndexError`, so that sequence protocols (iteration
    by index, `except IndexError`) keep working."""
