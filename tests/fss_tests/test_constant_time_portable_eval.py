"""The portable backend's eval kernels (issue 45: "no secret-dependent branch in any gen/eval kernel"; the
portable gen kernels: `test_constant_time.py`, the fused tiers': `test_constant_time_fused.py`) take no
branch and compute no address from a key's secret arrays (seeds, correction words, control bits, the
PRG output and the payload sums derived from them), by the same LLVM IR check (`ir_taint`), for the
argument types the library passes: each kernel's signatures are those numba compiled when the portable
eval_batch, eval_sum and eval_grid ran on DCFs of width 1 and 3, a 32-bit DPF and F_p keys of width 1
and 2. Public: the points x and their bits, the shapes, the party.

One finding, declassified by name (`ECB_STATUS`): `_ecbwalk.eval_chunks` branches on the status that
pycryptodome's ECB function returns (0, or an error code for bad arguments: not a function of the data
it encrypts), to stop on an error. A test checks it is all the check finds there."""
from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import fss._ecbwalk as W
import fss._kernels as K
from fss import DCF, DPF, portable
from test_constant_time import compiled_ir, ir_violations

ECB_STATUS = r"^icmp (eq|ne) i32 %\S+, 0$"  # the ECB call's return code (`_ecbwalk._ecb`), checked against 0
FUNCTIONS = [DCF(10, 64, 1), DCF(10, 64, 3), DPF(9, 32, 1), DCF(8, group="p61", width=1), DCF(8, group="p61", width=2)]
KERNELS = {  # kernel: its secret arguments
    "eval_level": (K.eval_level, ("out", "s", "t", "acc", "cw_seed", "cw_t", "cw_v")),
    "fill_eval": (K.fill_eval, ("s",)),
    "fill_expand": (K.fill_expand, ("s",)),
    "fill_leaf": (K.fill_leaf, ("s",)),
    "sum_columns": (K.sum_columns, ("values",)),
    "eval_chunks": (W.eval_chunks, ("seeds", "cw_seed", "cw_t", "cw_v")),
}


@functools.lru_cache(maxsize=None)
def _ran() -> bool:
    """Runs the portable eval paths once, so that each kernel has the signatures the library compiles."""
    for fn in FUNCTIONS:
        p, n = fn.params, 40
        alphas = np.arange(n, dtype=np.uint64) * np.uint64(37) % np.uint64(1 << p.bits)
        roots = (np.arange(4 * n, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)).reshape(2, 2, n)
        k0, _ = portable.gen_batch(p, alphas, np.ones((p.width, n), np.uint64), roots)
        portable.eval_batch(k0, alphas)
        portable.eval_sum(k0, alphas[:3])
        portable.eval_grid(k0, 0, 64, False)
    return True


def _irs(name: str) -> tuple[tuple, list[str]]:
    _ran()
    dispatcher, secrets = KERNELS[name]
    assert dispatcher.signatures, name
    irs = []
    for sig in dispatcher.signatures:
        with warnings.catch_warnings():  # a kernel loaded from the disk cache has no IR: compile a copy
            warnings.simplefilter("ignore")
            ir = dispatcher.inspect_llvm(sig)
        irs.append(ir if "%arg." in ir else compiled_ir(dispatcher.py_func, sig))
    return secrets, irs


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_portable_eval_kernel_has_no_secret_dependent_branch_or_address(name):
    secrets, irs = _irs(name)
    for ir in irs:
        assert ir_violations(ir, secrets, (ECB_STATUS,)) == []


def test_the_ecb_status_is_the_only_finding_of_the_ecb_walk():
    """Without `ECB_STATUS`, eval_chunks' only findings are branches on the ECB call's return code."""
    secrets, irs = _irs("eval_chunks")
    for ir in irs:
        found = ir_violations(ir, secrets)
        lines = ir.splitlines()
        assert found and all(f.startswith("branch on a secret in fss._ecbwalk.eval_chunks") for f in found), found
        for f in found:  # the branch's condition is the compare of a value an indirect call returned
            at = int(f.split("IR line ")[1].split(")")[0]) - 1
            cond = lines[at].split("br i1 ")[1].split(",")[0]
            compare = next(x for x in lines[at - 3:at] if x.strip().startswith(cond + " = icmp"))
            called = compare.split("i32 ")[1].split(",")[0]
            assert any(x.strip().startswith(f"{called} = call i32 %") for x in lines[at - 4:at]), (compare, lines[at - 4:at])
