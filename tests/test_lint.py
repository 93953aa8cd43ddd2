"""The linter in CI (issue 43): pyflakes' checks through ruff (`[tool.ruff]` in pyproject.toml: unused
and undefined names, syntax errors) over every Python file of the project. A finding fails the test
with ruff's own one-line report of each."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    run = subprocess.run([ruff, "check", "--output-format", "concise", "dpcdf", "fss", "bench", "tests", "examples"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
