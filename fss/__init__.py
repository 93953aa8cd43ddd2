"""fss: function secret sharing. Distributed point and comparison functions (DPF, DCF) with a
fixed-key AES PRG, single and batched gen/eval, and a strict versioned key format; gates on masked
inputs built on the DCF (comparison, interval containment, ReLU: `fss.gates`).

    >>> from fss import DCF
    >>> dcf = DCF(bits=32)                      # f(x) = 1 if x < alpha else 0, mod 2^64
    >>> k0, k1 = dcf.gen(alpha=1000)
    >>> dcf.reconstruct(dcf.eval(k0, 999), dcf.eval(k1, 999))
    1

Keys load from their bytes alone (the header names the function) and batches stream to files:

    >>> fn, key = fss.load_key(k0.to_bytes())  # doctest: +SKIP
    >>> fss.write_batch(batch, "keys.bin"); fn, batch = fss.read_batch("keys.bin")  # doctest: +SKIP

The byte format is specified in docs/key-format.md. `fss.testing` makes keys from given seeds, for tests
and interop vectors only.

This is the hazardous-materials layer: it knows nothing of differential privacy (that is `dpcdf`).
"""
from .dcf import DCF
from .dpf import DPF
from .errors import FssError, KeyFormatError, KeyIndexError, KeyMismatchError, ParameterError
from .gates import ComparisonGate, IntervalGate, MultiIntervalGate, ReluGate
from .keys import Key, KeyBatch
from .loaders import Loaded, function_of, load_batch, load_key, load_keys, read_batch, write_batch
from . import layout  # keys as rows and as grouped arrays (stores, transports, files)

# Submodules load on first access (`fss.backend`, `fss.portable`, ...), so that `import fss` imports
# neither numba nor llvmlite: they come with the first kernel (gen, eval, or `fss.backend.available()`).
_SUBMODULES = frozenset({"backend", "codec", "dcf", "dpf", "errors", "fast", "field", "function", "gates", "inputs", "keys",
                         "loaders", "params", "portable", "prg", "reference", "testing"})


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DCF", "DPF", "ComparisonGate", "FssError", "IntervalGate", "Key", "KeyBatch", "KeyFormatError", "KeyIndexError",
           "KeyMismatchError", "Loaded", "MultiIntervalGate", "ParameterError", "ReluGate", "function_of", "load_batch",
           "load_key", "load_keys", "read_batch", "write_batch"]
__all__ += ["layout"]
__version__ = "0.1.0"
