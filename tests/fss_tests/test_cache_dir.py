"""Where the compiled kernels are cached (`fss._cache`): the user's cache folder by default
($XDG_CACHE_HOME/fss-dpcdf/numba, else ~/.cache/fss-dpcdf/numba), NUMBA_CACHE_DIR when set, never the
package's own folder; a read-only package folder (a site install) neither breaks import and eval nor
loses the cache. Each case in a child process with its own HOME and cache folders, on a copy of the package."""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fss

FSS_DIR = Path(fss.__file__).resolve().parent

CHILD = textwrap.dedent(
    """
    import json, warnings
    warnings.simplefilter("error", RuntimeWarning)  # "kernels will not be cached" would fail the child
    import numpy as np
    import fss
    from fss import DCF, _cache, _kernels, _linear, backend, testing

    fn = DCF(8)
    k0, k1 = testing.gen(fn, 77, 5, randomness=bytes(range(32)))
    shares = [fn.reconstruct(fn.eval(k0, x), fn.eval(k1, x)) for x in (76, 77, 78)]
    _kernels.sum_columns(np.arange(6, dtype=np.uint64).reshape(2, 3), np.uint64(7))
    paths = {d._cache._cache_path for d in (_kernels.sum_columns, _kernels.gen_level, _linear.sums_of)}
    print(json.dumps(dict(file=fss.__file__, shares=[int(s) for s in shares], paths=sorted(paths),
                          cache_dir=_cache.cache_dir(_kernels.sum_columns), info_dir=backend.info()["cache_dir"],
                          hits=sum(_kernels.sum_columns._cache_hits.values()))))
    """
)


def _drop_dac():
    """In the child (as root): without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, file modes bind root too."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0):  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run(tmp_path, env_extra, read_only=False):
    pkg = tmp_path / "site"
    if not (pkg / "fss").exists():
        shutil.copytree(FSS_DIR, pkg / "fss", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "FSS_BACKEND")}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(pkg), FSS_BACKEND="portable", PYTHONDONTWRITEBYTECODE="1")
    env.update(env_extra)
    (tmp_path / "home").mkdir(exist_ok=True)
    if read_only:
        for d, _, files in os.walk(pkg):
            for f in files:
                os.chmod(os.path.join(d, f), 0o444)
            os.chmod(d, 0o555)
    try:
        res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, cwd=tmp_path,
                             timeout=900, preexec_fn=_drop_dac if read_only and os.geteuid() == 0 else None)
    finally:
        if read_only:
            for d, _, _ in os.walk(pkg):
                os.chmod(d, 0o755)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve().parent == pkg / "fss"
    assert out["shares"] == [5, 0, 0]  # DCF(8), "lt": beta = 5 below alpha = 77, else 0
    assert not list((pkg / "fss").rglob("*.nb[ic]")), "cache entries in the package's folder"
    assert len(out["paths"]) == 1 and out["paths"][0] == out["cache_dir"] == out["info_dir"]
    return Path(out["paths"][0]), out


def test_xdg_cache_home(tmp_path):
    path, first = run(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert path.parent == tmp_path / "xdg" / "fss-dpcdf" / "numba" and path.name.startswith("fss_")
    assert list(path.glob("fss._kernels.sum_columns*.nbc")) and list(path.glob("fss._kernels.gen_level*.nbi"))
    again, second = run(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert again == path and first["hits"] == 0 and second["hits"] == 1  # the second process loads it


def test_home_cache_without_xdg(tmp_path):
    path, _ = run(tmp_path, {})
    assert path.parent == tmp_path / "home" / ".cache" / "fss-dpcdf" / "numba"
    assert list(path.glob("fss._kernels.*.nbc"))


def test_numba_cache_dir_wins(tmp_path):
    path, _ = run(tmp_path, {"NUMBA_CACHE_DIR": str(tmp_path / "nb"), "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert path.parent == tmp_path / "nb"
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home" / ".cache").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="drops capabilities with Linux's prctl when run as root")
def test_read_only_package_folder(tmp_path):
    path, first = run(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}, read_only=True)
    assert path.parent == tmp_path / "xdg" / "fss-dpcdf" / "numba"
    _, second = run(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}, read_only=True)
    assert first["hits"] == 0 and second["hits"] == 1
