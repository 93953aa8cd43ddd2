"""The examples run (at small sizes) and write what they promise."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_fss_quickstart_runs():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "fss_quickstart.py")], capture_output=True, text=True, check=True)
    assert "65535" in out.stdout and "count" in out.stdout


def test_masked_comparison_runs():
    """Issue 45: a secure comparison, sign and ReLU on masked inputs between two simulated parties."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "masked_comparison.py")], capture_output=True, text=True, check=True)
    assert "ReLU(x)" in out.stdout and "2147483647 |              0 |              1 |     2147483647" in out.stdout


def test_paper_figures_write_their_pngs(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "paper_figures.py"), "--bits", "6", "--runs", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, check=True,
    )
    assert "Figure 4" in out.stdout
    for name in ("figure2_smoothing_vs_epsilon.png", "figure3_smoothing_vs_lambda.png", "figure4_inverse_ecdf.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_roc_and_hosmer_lemeshow_examples_write_their_pngs(tmp_path):
    for script, args in (("roc_curve.py", []), ("hosmer_lemeshow.py", ["--runs", "2"])):
        out = tmp_path / (script + ".png")
        run = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args, "--out", str(out)],
                             capture_output=True, text=True, check=True)
        assert "eps=" in run.stdout and out.stat().st_size > 1000


def test_two_server_roc_example_runs(tmp_path):
    out = tmp_path / "roc2.png"
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "two_server_roc.py"), "--out", str(out)],
                         capture_output=True, text=True, check=True, timeout=600)
    assert "DP AUC" in run.stdout and out.stat().st_size > 1000


def test_examples_that_need_scikit_learn_name_their_extra_when_it_is_missing():
    """Issue 46: the README's install brings no scikit-learn; the three examples that use it say which
    extra brings it (`.[examples]`) and exit, rather than end in an ImportError's traceback."""
    block = "import sys; sys.modules['sklearn'] = None; import runpy; runpy.run_path(sys.argv[1], run_name='__main__')"
    for script in ("roc_curve.py", "hosmer_lemeshow.py", "two_server_roc.py"):
        run = subprocess.run([sys.executable, "-c", block, str(ROOT / "examples" / script)], capture_output=True, text=True)
        assert run.returncode == 1 and "pip install -e '.[examples]'" in run.stderr and "Traceback" not in run.stderr, script
