"""numpy on first use, for the modules that `import fss` loads (private).

`import fss` and `DCF(32)` need no numpy (parameters are plain Python), and numpy's import is the bulk
of what is left of `import fss` once numba is deferred (0.2-0.4 s on a loaded two-core machine). A
module writes `np = numpy(__name__)`: the first attribute read (`np.uint64`, ...) imports numpy and
rebinds the module's global `np` to the real module, so later reads cost nothing extra. Only for code
that touches `np` inside functions; annotations are strings there (`from __future__ import annotations`).
The type checker sees numpy itself (a module writes `if TYPE_CHECKING: import numpy as np` and takes the
stand-in in the `else:` branch), so `np.ndarray` in an annotation means numpy's.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any


class _Deferred:
    __slots__ = ("_owner", "_global")

    def __init__(self, owner: str, global_name: str):
        self._owner, self._global = owner, global_name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module("numpy")
        setattr(sys.modules[self._owner], self._global, module)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<numpy, imported at first use by {self._owner}>"


def numpy(owner: str, global_name: str = "np") -> Any:
    """A stand-in for numpy in module `owner`'s global `global_name` (see the module docstring)."""
    if "numpy" in sys.modules:
        return sys.modules["numpy"]
    return _Deferred(owner, global_name)
