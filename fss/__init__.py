"""fss: function secret sharing. Distributed point and comparison functions (DPF, DCF) with a
fixed-key AES PRG, single and batched gen/eval, and a strict versioned key format.

    >>> from fss import DCF
    >>> dcf = DCF(bits=32)                      # f(x) = 1 if x < alpha else 0, mod 2^64
    >>> k0, k1 = dcf.gen(alpha=1000)
    >>> dcf.reconstruct(dcf.eval(k0, 999), dcf.eval(k1, 999))
    1

This is the hazardous-materials layer: it knows nothing of differential privacy (that is `dpcdf`).
"""
from .dcf import DCF
from .dpf import DPF
from .errors import FssError, KeyFormatError, KeyIndexError, KeyMismatchError, ParameterError
from .keys import Key, KeyBatch

__all__ = ["DCF", "DPF", "FssError", "Key", "KeyBatch", "KeyFormatError", "KeyIndexError", "KeyMismatchError", "ParameterError"]
__version__ = "0.1.0"
