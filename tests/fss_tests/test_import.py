"""`import fss` is cheap: numba, llvmlite (and numpy) load only when a kernel is first needed.

Checked on the modules a fresh interpreter has loaded, not on time (the machine is shared)."""
import json
import subprocess
import sys
import textwrap

HEAVY = ("numba", "llvmlite", "numpy")

CHILD = textwrap.dedent(
    """
    import json, sys
    seen = {}
    import fss
    seen["import fss"] = [m for m in HEAVY if m in sys.modules]
    from fss import DCF, DPF, KeyBatch, FssError
    dcf = DCF(32)
    dpf = DPF(16, 32, 2)
    seen["DCF(32), DPF(16, 32, 2), key_size"] = [m for m in HEAVY if m in sys.modules] + [dcf.key_size * 0]
    seen["first gen"] = None
    k0, k1 = dcf.gen(1000)
    value = dcf.reconstruct(dcf.eval(k0, 999), dcf.eval(k1, 999))
    seen["after gen"] = [m for m in HEAVY if m in sys.modules]
    # the submodules stay reachable as attributes of the package
    seen["attributes"] = [fss.backend.current() in fss.backend.available(), callable(fss.portable.eval_batch)]
    print(json.dumps(dict(seen=seen, value=value)))
    """
).replace("HEAVY", repr(HEAVY))


def test_import_fss_loads_neither_numba_nor_llvmlite():
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    seen = out["seen"]
    assert seen["import fss"] == [], f"import fss loaded {seen['import fss']}"
    assert seen["DCF(32), DPF(16, 32, 2), key_size"] == [0], seen
    assert {"numba", "llvmlite", "numpy"} <= set(seen["after gen"])  # the first gen brought the kernels
    assert seen["attributes"] == [True, True]
    assert out["value"] == 1
