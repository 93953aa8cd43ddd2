"""The committed known answers: a change that alters any key byte, share or PRG block fails here."""
import json
from pathlib import Path

import pytest

from fss import DCF, DPF, KeyFormatError
from fss import reference as R
from fss.prg import FIXED_KEY, LABEL, expand_one

pytestmark = pytest.mark.usefixtures("each_backend")

DOC = json.loads((Path(__file__).parents[1] / "vectors" / "fss_v1.json").read_text())


def _function(v):
    if v["function"] == "DPF":
        return DPF(v["bits"], v["out_bits"], v["width"], signed=v["signed"])
    return DCF(v["bits"], v["out_bits"], v["width"], cmp=v["cmp"], signed=v["signed"])


def _ids(vs):
    return [f"{v['function']}-{v['bits']}-{v['out_bits']}-{v['width']}-{v['cmp']}-{v.get('alpha', v.get('why'))}" for v in vs]


def test_prg_known_answers():
    assert DOC["prg_label"] == LABEL.decode() and DOC["prg_fixed_key"] == FIXED_KEY.hex()
    for case in DOC["prg"]:
        seed = int.from_bytes(bytes.fromhex(case["seed"]), "little")
        assert expand_one(seed, case["role"], case["block"]).to_bytes(16, "little").hex() == case["out"]


@pytest.mark.parametrize("v", DOC["vectors"], ids=_ids(DOC["vectors"]))
def test_key_vector(v):
    fn = _function(v)
    p = fn.params
    rnd = bytes.fromhex(v["randomness"])
    beta = v["beta"] if fn.width > 1 else v["beta"][0]
    k0, k1 = fn._gen_with_randomness(v["alpha"], beta, rnd)
    assert k0.to_bytes().hex() == v["key0"]
    assert k1.to_bytes().hex() == v["key1"]
    r0, r1 = R.gen(p, v["alpha"], v["beta"], int.from_bytes(rnd[:16], "little"), int.from_bytes(rnd[16:], "little"))
    assert R.encode(p, r0).hex() == v["key0"] and R.encode(p, r1).hex() == v["key1"]
    d0, d1 = fn.key_from_bytes(bytes.fromhex(v["key0"])), fn.key_from_bytes(bytes.fromhex(v["key1"]))
    for x, s0, s1, val in zip(v["points"], v["shares0"], v["shares1"], v["values"]):
        y0, y1 = fn.eval(d0, x), fn.eval(d1, x)
        assert (list(y0) if fn.width > 1 else [y0]) == s0
        assert (list(y1) if fn.width > 1 else [y1]) == s1
        assert R.eval(p, r0, x) == s0 and R.eval(p, r1, x) == s1
        assert [(a + b) & p.mask for a, b in zip(s0, s1)] == val == R.function_value(p, v["alpha"], v["beta"], x)


@pytest.mark.parametrize("v", DOC["bad_keys"], ids=_ids(DOC["bad_keys"]))
def test_bad_key_vector(v):
    with pytest.raises(KeyFormatError, match=v["match"]):
        _function(v).key_from_bytes(bytes.fromhex(v["key"]))


def test_vectors_cover_the_edges():
    alphas = {(v["function"], v["bits"], v["signed"], v["alpha"]) for v in DOC["vectors"]}
    assert ("DCF", 32, False, 0) in alphas and ("DCF", 32, False, (1 << 32) - 1) in alphas
    assert ("DCF", 64, True, -(1 << 63)) in alphas and ("DCF", 64, False, (1 << 64) - 1) in alphas
    assert {v["cmp"] for v in DOC["vectors"]} == {"lt", "le", "gt", "ge", "eq"}
