"""The lean install (issue 43): `pip install fss-dpcdf` is `fss` with numpy, numba and pycryptodome
(and cffi, pycryptodome's C backend, which fss's portable tier calls directly) only; dpcdf's release (scipy, osqp), the service (cryptography, FastAPI, uvicorn) and the tools come
with extras (`[release]`, `[service]`, `[demo]`, `[test]`, ...). Checked here in subprocesses in
which importing an optional package fails (a meta-path finder, as in a venv without it), and in
`.ci/run` by a real install of the base package into a bare venv."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ("scipy", "osqp")
SERVICE = ("cryptography", "fastapi", "starlette", "pydantic", "uvicorn", "httpx")
TOOLS = ("matplotlib", "sklearn", "dask", "distributed", "hypothesis", "pytest")
BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Block())
"""


def _run(blocked: tuple[str, ...], body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=set(blocked)) + body], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def _requirement_names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in requirements}


def test_the_base_install_is_fss_alone_and_every_tool_extra_brings_the_service():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _requirement_names(project["dependencies"]) == {"numpy", "numba", "pycryptodome", "cffi"}  # cffi: pycryptodome's fast backend
    extras = project["optional-dependencies"]
    assert _requirement_names(extras["release"]) == {"scipy", "osqp"}
    assert "fss-dpcdf[release]" in extras["service"] and {"cryptography", "fastapi", "uvicorn"} <= _requirement_names(extras["service"])
    for name in ("test", "demo", "examples", "bench", "dask"):  # the README's two commands install `test` and `demo`
        assert "fss-dpcdf[service]" in extras[name], name


def test_fss_works_with_no_optional_package():
    """A DCF and a DPF round trip, and no optional package was imported along the way."""
    out = _run(RELEASE + SERVICE + TOOLS, """
import numpy as np
from fss import DCF, DPF
dcf = DCF(bits=16, out_bits=32, cmp="le")
k0, k1 = dcf.gen(alpha=300, beta=1)
assert dcf.reconstruct(dcf.eval(k0, 300), dcf.eval(k1, 300)) == 1
assert dcf.reconstruct(dcf.eval(k0, 301), dcf.eval(k1, 301)) == 0
dpf = DPF(12)
p0, p1 = dpf.gen(7)
assert np.flatnonzero(dpf.reconstruct(dpf.eval_full(p0), dpf.eval_full(p1))).tolist() == [7]
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED]
print("fss ok")
""")
    assert out.returncode == 0 and out.stdout.strip() == "fss ok", out.stderr[-2000:]


def test_dpcdf_release_works_without_the_service():
    """The central release (the adaptive default, with its PCHIP and monotone fits from scipy) with
    none of the service's packages."""
    out = _run(SERVICE + TOOLS, """
import numpy as np
import dpcdf
grid = dpcdf.Grid.uniform(0, 100, 10)
rel = dpcdf.release_ecdf(np.linspace(0, 100, 2000), grid, epsilon=1.0)
assert abs(float(rel.ecdf(50)) - 0.5) < 0.1 and type(rel.mechanism).__name__ == "AdaptiveMechanism"
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED]
print("release ok")
""")
    assert out.returncode == 0 and out.stdout.strip() == "release ok", out.stderr[-2000:]


def test_a_command_without_its_extra_names_the_extra(tmp_path):
    """`dpcdf serve` where FastAPI is missing: one line naming the extra to install, exit 2; the same
    command then runs on to its own error once the package is there (a bad port: not an import error)."""
    body = f"""
from dpcdf.cli import main
sys.exit(main(["serve", "--party", "0", "--port", "-1", "--data", {str(tmp_path / "s0")!r}]))
"""
    out = _run(SERVICE, body)
    assert out.returncode == 2 and "pip install 'fss-dpcdf[service]'" in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    again = _run((), body)
    assert again.returncode == 2 and "fss-dpcdf[" not in again.stderr and again.stderr.startswith("dpcdf: "), again.stderr
