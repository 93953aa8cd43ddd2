"""The README's code runs, and its comments about results are true."""
import re
from pathlib import Path

import numpy as np

README = (Path(__file__).parents[1] / "README.md").read_text()


def test_fss_ten_lines_run_and_say_the_truth():
    block = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    scope: dict = {}
    exec(block, scope)
    dcf, k0, k1, K0, K1 = (scope[k] for k in ("dcf", "k0", "k1", "K0", "K1"))
    assert dcf.reconstruct(dcf.eval(k0, 999), dcf.eval(k1, 999)) == 1
    assert dcf.reconstruct(dcf.eval(k0, 1000), dcf.eval(k1, 1000)) == 0
    np.testing.assert_array_equal(dcf.reconstruct(dcf.eval_sum(K0, [100]), dcf.eval_sum(K1, [100])), [1])
    assert len(block.strip().splitlines()) <= 12


def test_every_python_block_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(block, {})
