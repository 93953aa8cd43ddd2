"""The type checker in CI (issue 43): mypy over every module of fss and dpcdf, as `[tool.mypy]` in
pyproject.toml sets it (the targeted Python; only third-party packages without type information are
taken as Any). A finding fails the test with mypy's own report of each. Its cache (.mypy_cache) keeps
a rerun to a few seconds; a cold run takes about 10-20 s."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_nothing():
    run = subprocess.run([sys.executable, "-m", "mypy", "fss", "dpcdf"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
