"""The reach into pycryptodome's private ECB internals (`fss.prg`): when a release renames them the
portable backend says so, once a process (one log record on logger "fss" and one RuntimeWarning),
reports it in `fss.backend.info()`, and still gives the bits of the fast path."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from fss import backend

CHILD = textwrap.dedent(
    """
    import json, logging, sys, types, warnings

    logs = []

    class Keep(logging.Handler):
        def emit(self, record):
            logs.append((record.levelname, record.getMessage()))

    logging.getLogger("fss").addHandler(Keep())
    warnings.simplefilter("always")  # a second warning would show (no once-per-location filter)

    import numpy as np
    import Crypto.Cipher
    from Crypto.Cipher import _mode_ecb
    import fss
    from fss import DCF, DPF, backend, portable, testing

    if BREAK:  # a pycryptodome release without `raw_ecb_lib`: its public API keeps working
        stub = types.ModuleType(_mode_ecb.__name__)
        stub.__dict__.update({k: v for k, v in vars(_mode_ecb).items() if k != "raw_ecb_lib"})
        sys.modules[_mode_ecb.__name__] = stub
        Crypto.Cipher._mode_ecb = stub

    out = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with backend.using("portable"):
            for fn, n in ((DCF(16), 300), (DPF(9, 40, 3), 40), (DCF(20, 64, 2, cmp="ge"), 17)):
                rng = np.random.default_rng(n)
                alphas = rng.integers(0, 1 << fn.bits, n, dtype=np.uint64)
                k0, k1 = testing.gen_batch(fn, alphas, 1, seed=n)
                xs = rng.integers(0, 1 << fn.bits, n, dtype=np.uint64)
                for fused in (True, False):  # the one-call level loop (`_ecbwalk`), and the Python loop (`EcbPass`)
                    portable.FUSED_LOOP = fused
                    for k in (k0, k1):
                        out.append(np.asarray(fn.eval_batch(k, xs)).tolist())
                        out.append(np.asarray(fn.eval_sum(k, xs[:3])).tolist())
                portable.FUSED_LOOP = True
                a0, a1 = testing.gen(fn, int(alphas[0]), 1, randomness=bytes(range(32)))
                out.append([str(fn.eval(a, int(xs[0]))) for a in (a0, a1)])
    warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    print(json.dumps(dict(out=out, warned=warned, logs=logs, info=backend.info())))
    """
)


def run_child(broken: bool) -> dict:
    env = {**os.environ}
    env.pop("FSS_BACKEND", None)
    res = subprocess.run([sys.executable, "-c", CHILD.replace("BREAK", str(broken))], env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not backend.info()["fast_ecb"], reason="no fast ECB path here to compare the fallback with: "
                    f"{backend.info()['fast_ecb_error']}")
def test_changed_internals_warn_once_and_keep_the_bits():
    fast, slow = run_child(False), run_child(True)
    assert fast["warned"] == [] and fast["logs"] == []
    assert fast["info"]["fast_ecb"] is True and fast["info"]["fast_ecb_error"] is None
    assert len(slow["warned"]) == 1, slow["warned"]
    assert len(slow["logs"]) == 1 and slow["logs"][0] == ["WARNING", slow["warned"][0]]
    msg = slow["warned"][0]
    assert "raw_ecb_lib" in msg and "public ECB API" in msg and "slower" in msg, msg  # what failed, and what it costs
    assert slow["info"]["fast_ecb"] is False and "raw_ecb_lib" in slow["info"]["fast_ecb_error"]
    assert slow["out"] == fast["out"]


def test_info_reports_the_choice():
    info = backend.info()
    assert info["backend"] == backend.chosen() and "portable" in info["available"]
    assert isinstance(info["fast_ecb"], bool) and (info["fast_ecb_error"] is None) == info["fast_ecb"]
