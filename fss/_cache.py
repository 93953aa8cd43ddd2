"""An on-disk cache of the compiled numba kernels, so that a fresh process does not wait for numba.

Private. numba's own cache (`njit(cache=True)`) does not fit the fused kernels: its key pickles a
closure's cells, and the intrinsics in those cells pickle with a random uuid (so a new process never
hits), and it checks only the freshness of the kernel's own source file, not of `_fused` and `_aes`
where its code is generated. `njit(tag=...)` and `cached(dispatcher, tag)` give a dispatcher numba's
cache machinery with another key:

- the tag: every compile-time choice the kernel closes over (payload width, DCF or DPF, VAES or
  AES-NI, ...), spelled by the caller;
- the argument types, and numba's codegen "magic tuple" (target triple, host CPU name and features);
- a hash of every source file of the `fss` package (its version is in `__init__.py`) with the numba,
  llvmlite and Python versions: any edit of the package invalidates every entry.

Where entries live (`cache_dir(kernel)`): in $NUMBA_CACHE_DIR if set (numba's own setting, which wins), else
in the user's cache directory, `$XDG_CACHE_HOME/fss-dpcdf/numba` or `~/.cache/fss-dpcdf/numba`
(`~/Library/Caches/fss-dpcdf/numba` on macOS, `%LOCALAPPDATA%\\fss-dpcdf\\numba` on Windows), never
in the package's own folder unless neither is writable (then `fss/__pycache__` if that is, as numba's
default would). Each in a subfolder named by the package's path (as numba names them), so two
installs never share entries. The location is chosen when a kernel is defined (its module imported),
before anything is compiled. One index file per kernel and tag; each data file is named by a hash of
its key, so two processes that compile different kernels at once never write them under one name. If
no cache location is writable, the kernels are compiled per process (one warning says so).
"""
from __future__ import annotations

import functools
import glob
import hashlib
import os
import sys
import warnings

import llvmlite
import numba
from numba.core import caching as _nc
from numba.core.caching import CompileResultCacheImpl, FunctionCache, IndexDataCacheFile
from numba.core.runtime import rtsys

_HERE = os.path.dirname(os.path.abspath(__file__))
APP = "fss-dpcdf"


def _numba_class(name: str):
    return getattr(_nc, name, None) or getattr(_nc, "_" + name)  # numba < 0.61 named them with an underscore


def user_cache_dir() -> str | None:
    """The per-user folder of the kernel cache (without NUMBA_CACHE_DIR): $XDG_CACHE_HOME/fss-dpcdf/numba
    (an absolute XDG_CACHE_HOME), else ~/.cache/fss-dpcdf/numba (macOS: ~/Library/Caches/..., Windows:
    %LOCALAPPDATA%\\fss-dpcdf\\numba); None without a home directory."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        base = xdg
    elif sys.platform == "win32" and os.path.isabs(os.environ.get("LOCALAPPDATA", "")):
        base = os.environ["LOCALAPPDATA"]
    else:
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, "Library", "Caches") if sys.platform == "darwin" else os.path.join(home, ".cache")
    return os.path.join(base, APP, "numba")


def cache_dir(kernel) -> str | None:
    """The folder a kernel defined by `njit` (any: they share the location) puts its entries in, in this
    process (the package's subfolder included); None when no location is writable (then every process
    compiles them). The kernel is the caller's, so that this module imports none of them."""
    cache = getattr(kernel, "_cache", None)
    return getattr(cache, "_cache_path", None)


class _UserCacheLocator(_numba_class("SourceFileBackedLocatorMixin"), _numba_class("CacheLocator")):  # type: ignore[misc]  # bases by name (numba versions)
    """numba's cache locator for `user_cache_dir()`, with numba's subfolder per package path."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(user_cache_dir(), self.get_suitable_cache_subpath(py_file))

    def get_cache_path(self):
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        if user_cache_dir() is None:
            return None
        return super().from_function(py_func, py_file)  # None when it cannot be created or written


class _CacheImpl(CompileResultCacheImpl):
    # NUMBA_CACHE_DIR, then the user's cache folder, then (only if that is not writable) the package's
    # __pycache__ if writable; NUMBA_CACHE_LOCATOR_CLASSES, if set, overrides the list as for numba.
    _locator_classes = [_numba_class("UserProvidedCacheLocator"), _UserCacheLocator, _numba_class("InTreeCacheLocator")]


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """SHA-256 over the package's sources and the compiler versions: the freshness stamp of every entry."""
    h = hashlib.sha256()
    h.update(f"numba {numba.__version__} llvmlite {llvmlite.__version__} python {sys.version}".encode())
    for name in sorted(os.listdir(_HERE)):
        if name.endswith(".py"):
            with open(os.path.join(_HERE, name), "rb") as f:
                data = f.read()
            h.update(b"\0%s\0%d\0" % (name.encode(), len(data)))
            h.update(data)
    return h.hexdigest()


class _IndexFile(IndexDataCacheFile):
    """numba's index/data files, with data files named by a hash of their key (written before the index
    entry that points to them) and the stale data of an outdated index removed."""

    def __init__(self, cache_path, filename_base, source_stamp):
        super().__init__(cache_path, filename_base, source_stamp)
        self._base = filename_base

    def save(self, key, data):
        overloads = self._load_index()
        stale = not overloads and os.path.exists(self._index_path)
        name = "%s.%s.nbc" % (self._base, _digest((self._source_stamp, key)))  # never one name for two codes
        self._save_data(name, data)
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)
        if stale:  # an index of other sources or versions: its data files are dead
            keep = {os.path.join(self._cache_path, n) for n in overloads.values()}
            for path in glob.glob(os.path.join(glob.escape(self._cache_path), glob.escape(self._base) + ".*.nbc")):
                if path not in keep:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass


def _digest(key) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:20]


class KernelCache(FunctionCache):
    """numba's FunctionCache keyed on (argument types, codegen magic tuple, tag) and stamped with
    `source_hash()` instead of the bytecode, closure and source file of the function, in `cache_dir(kernel)`."""

    _impl_class = _CacheImpl

    def __init__(self, py_func, tag: str):
        super().__init__(py_func)
        self._tag = tag
        name = py_func.__module__ + "." + py_func.__qualname__.replace("<locals>.", "")
        base = "%s%s.py%d%d" % (name, "-" + tag if tag else "", sys.version_info[0], sys.version_info[1])
        base = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)
        self._cache_file = _IndexFile(cache_path=self._cache_path, filename_base=base, source_stamp=source_hash())

    def load_overload(self, sig, target_context):
        # numba's version first refreshes the target context's registries, which imports most of
        # numba.np (and through it scipy.linalg): about 1 s, the bulk of a warm start. A cached
        # kernel is machine code that needs none of them (only numba's runtime, NRT, which the
        # refresh would initialize), and a real compile refreshes on its own.
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    def _index_key(self, sig, codegen):
        return (sig, codegen.magic_tuple(), self._tag)


def cached(dispatcher, tag: str):
    """Gives a numba dispatcher (not yet compiled) the on-disk `KernelCache`; returns it. `tag` must
    name every value the function closes over that changes its code."""
    if not hasattr(dispatcher, "py_func"):  # NUMBA_DISABLE_JIT: a plain Python function
        return dispatcher
    global _uncached
    try:
        dispatcher._cache = KernelCache(dispatcher.py_func, tag)
    except Exception as exc:  # no writable cache location, or a numba without these internals
        if not _uncached:  # once a process, not once a kernel
            _uncached = True
            warnings.warn(f"fss: kernels will not be cached on disk, every process compiles them ({exc})",
                          RuntimeWarning, stacklevel=2)
    return dispatcher


_uncached = False


def njit(tag: str | None = None, **options):
    """`numba.njit(**options)` with the on-disk `KernelCache`, for a function whose code depends on
    nothing but the package's sources (tag: anything else it closes over)."""

    def wrap(fn):
        return cached(numba.njit(**options)(fn), tag or "")

    return wrap
