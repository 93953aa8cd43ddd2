"""DCF and DPF with payloads in F_p, p = 2^61 - 1 (group "p61"): every alpha and every x on small
domains, agreement with the reference on random large ones, the strict codec, known answers, and
that prime keys never mix with keys over Z_{2^k}."""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fss import DCF, DPF, KeyBatch, KeyFormatError, KeyMismatchError, ParameterError, backend
from fss import field as F
from fss import reference as R

from helpers import CMPS

pytestmark = pytest.mark.usefixtures("each_backend")

P = F.P
DOC = json.loads((Path(__file__).parents[1] / "vectors" / "fss_prime_v1.json").read_text())


def make(kind, bits, width=1, signed=False):
    if kind == "eq":
        return DPF(bits, width=width, signed=signed, group="p61")
    return DCF(bits, width=width, cmp=kind, signed=signed, group="p61")


def truth(kind, alphas, xs, betas):
    a, x = alphas.astype(object), xs.astype(object)
    holds = {"lt": x < a, "le": x <= a, "gt": x > a, "ge": x >= a, "eq": x == a}[kind].astype(bool)
    return np.where(holds[:, None], betas, np.uint64(0)).astype(np.uint64)


def rows(fn, shares):
    return shares.reshape(shares.shape[0], fn.width)


@pytest.mark.parametrize("kind", CMPS + ("eq",))
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("bits", [1, 2, 3, 5])
@pytest.mark.parametrize("width", [1, 3])
def test_every_alpha_every_x(kind, signed, bits, width):
    fn = make(kind, bits, width, signed)
    lo, hi = fn.params.domain_range()
    dom = np.arange(lo, hi + 1, dtype=np.int64)
    rng = np.random.default_rng(bits * 10 + width)  # payload choice only
    betas = rng.integers(0, 1 << 61, size=(dom.size, width), dtype=np.uint64) % np.uint64(P)
    betas[0] = P - 1  # the largest element
    if dom.size > 1:
        betas[1] = 1  # the ECDF's payload
    k0, k1 = fn.gen_batch(dom, betas if width > 1 else betas[:, 0])
    idx = np.repeat(np.arange(dom.size), dom.size)
    xs = np.tile(dom, dom.size)
    y0, y1 = rows(fn, fn.eval_batch(k0.select(idx), xs)), rows(fn, fn.eval_batch(k1.select(idx), xs))
    assert (y0 < P).all() and (y1 < P).all()
    np.testing.assert_array_equal(fn.reconstruct(y0, y1), truth(kind, dom[idx], xs, betas[idx]))


@pytest.mark.parametrize("kind", CMPS + ("eq",))
def test_eval_sum_counts_every_alpha(kind):
    fn = make(kind, 4)
    dom = np.arange(16)
    k0, k1 = fn.gen_batch(dom, 1)
    got = fn.reconstruct(fn.eval_sum(k0, dom), fn.eval_sum(k1, dom))
    want = [sum(1 for a in dom if {"lt": x < a, "le": x <= a, "gt": x > a, "ge": x >= a, "eq": x == a}[kind]) for x in dom]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.uint64))


def test_negative_payloads_and_signed_reconstruction():
    fn = DCF(6, width=2, cmp="ge", group="p61")
    k0, k1 = fn.gen(10, [-(10**6), P - 1])
    assert fn.reconstruct(fn.eval(k0, 12), fn.eval(k1, 12), signed=True) == (-(10**6), -1)
    assert fn.reconstruct(fn.eval(k0, 9), fn.eval(k1, 9)) == (0, 0)
    b0, b1 = fn.gen_batch([3, 4], np.array([[-5, 5], [7, -(P - 1)]], dtype=object))
    got = fn.reconstruct(fn.eval_batch(b0, [63, 63]), fn.eval_batch(b1, [63, 63]), signed=True)
    np.testing.assert_array_equal(got, [[-5, 5], [7, 1]])


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("bits,width", [(1, 1), (4, 2), (6, 3)])
def test_dpf_eval_full_every_alpha(signed, bits, width):
    fn = make("eq", bits, width, signed)
    lo, hi = fn.params.domain_range()
    for alpha in range(lo, hi + 1):
        beta = [(alpha * 7 + e + 1) % P for e in range(width)]
        k0, k1 = fn.gen(alpha, beta if width > 1 else beta[0])
        full = rows(fn, fn.reconstruct(fn.eval_full(k0), fn.eval_full(k1)))
        want = np.zeros((1 << bits, width), np.uint64)
        want[alpha % (1 << bits)] = beta
        np.testing.assert_array_equal(full, want)


@settings(max_examples=25)
@given(
    kind=st.sampled_from(CMPS + ("eq",)), bits=st.integers(1, 64), width=st.integers(1, 3), signed=st.booleans(),
    data=st.data(), rnd=st.binary(min_size=32, max_size=32),
)
def test_agrees_with_the_reference(kind, bits, width, signed, data, rnd):
    fn = make(kind, bits, width, signed)
    p = fn.params
    lo, hi = p.domain_range()
    alpha = data.draw(st.integers(lo, hi))
    beta = data.draw(st.lists(st.integers(-(P - 1), P - 1), min_size=width, max_size=width))
    k0, k1 = fn._gen_with_randomness(alpha, beta if width > 1 else beta[0], rnd)
    r0, r1 = R.gen(p, alpha, beta, int.from_bytes(rnd[:16], "little"), int.from_bytes(rnd[16:], "little"))
    assert k0.to_bytes() == R.encode(p, r0) and k1.to_bytes() == R.encode(p, r1)
    for x in data.draw(st.lists(st.integers(lo, hi), min_size=1, max_size=4)) + [alpha]:
        s0, s1 = fn.eval(k0, x), fn.eval(k1, x)
        s0, s1 = (list(s0), list(s1)) if width > 1 else ([s0], [s1])
        assert s0 == R.eval(p, r0, x) and s1 == R.eval(p, r1, x)
        assert [(a + b) % P for a, b in zip(s0, s1)] == R.function_value(p, alpha, beta, x)


def test_codec_round_trip():
    fn = DCF(9, width=2, cmp="ge", group="p61")
    k0, k1 = fn.gen_batch(np.arange(40) * 7, np.array([[1, 0], [0, 1]] * 20))
    for batch in (k0, k1):
        again = fn.batch_from_bytes(batch.to_bytes(), batch.party)
        assert again.to_bytes() == batch.to_bytes()
        singles = [batch[i].to_bytes() for i in range(len(batch))]
        assert all(len(s) == fn.key_size for s in singles)
        assert fn.batch_from_keys(singles, batch.party).to_bytes() == batch.to_bytes()
        assert fn.key_from_bytes(singles[5]) == batch[5]
    header = k0[0].to_bytes()[:8]
    assert header[4] == 61 and header[5] & 0x10 and header[0] == 1


def test_strict_decoding_refuses_unreduced_corrections():
    fn = DCF(5, cmp="ge", group="p61")
    good = fn.gen(9)[0].to_bytes()
    p = fn.params
    start = 8 + 16 * (1 + p.bits) + p.t_bytes
    bits = int.from_bytes(good[start:], "little")
    for value in (P, (1 << 61) - 1):  # p itself (all 61 bits set) is the only unreduced 61-bit value
        bad = good[:start] + ((bits & ~P) | value).to_bytes(len(good) - start, "little")
        with pytest.raises(KeyFormatError, match="not reduced mod p"):
            fn.key_from_bytes(bad)
    batch = fn.gen_batch([1, 2], 1)[0].to_bytes()
    body = fn.params.body_len
    first_v = 16 + body + (start - 8)  # second key's first payload correction
    vb = int.from_bytes(batch[first_v : first_v + 8], "little")
    bad = batch[:first_v] + ((vb & ~P) | P).to_bytes(8, "little") + batch[first_v + 8 :]
    with pytest.raises(KeyFormatError, match="not reduced mod p"):
        fn.batch_from_bytes(bad)


def test_groups_never_mix():
    prime, ring61, ring = DCF(5, group="p61"), DCF(5, 61), DCF(5)
    k0, _ = prime.gen(3)
    r0, _ = ring61.gen(3)
    with pytest.raises(KeyMismatchError, match="group=p61"):
        ring61.eval(k0, 1)
    with pytest.raises(KeyMismatchError):
        prime.eval(r0, 1)
    with pytest.raises(KeyMismatchError):
        ring.eval_sum(prime.gen_batch([1, 2])[0], [0])
    with pytest.raises(KeyFormatError, match="parameters"):
        ring61.key_from_bytes(k0.to_bytes())  # same layout and out_bits, but the flags differ
    with pytest.raises(KeyFormatError, match="parameters"):
        prime.key_from_bytes(r0.to_bytes())
    with pytest.raises(KeyMismatchError, match="cannot mix"):
        KeyBatch.concatenate([prime.gen_batch([1])[0], ring61.gen_batch([1])[0]])
    assert DPF(4, group="p61").params != DPF(4, 61).params


def test_parameters_are_validated():
    with pytest.raises(ParameterError, match="group must be one of"):
        DCF(5, group="p62")
    with pytest.raises(ParameterError, match="out_bits = 61"):
        DCF(5, 64, group="p61")
    with pytest.raises(ParameterError, match="out_bits = 61"):
        DPF(5, True, group="p61")
    assert DCF(5, 61, group="p61").params == DCF(5, group="p61").params
    assert DCF(5).out_bits == 64 and DCF(5, group="p61").out_bits == 61 and DCF(5, group="p61").modulus == P
    fn = DCF(5, group="p61")
    with pytest.raises(ParameterError, match="beta must lie in"):
        fn.gen(3, P)
    with pytest.raises(ParameterError, match="beta must lie in"):
        fn.gen(3, -P)
    k0, k1 = fn.gen(3, -(P - 1))
    assert fn.reconstruct(fn.eval(k0, 1), fn.eval(k1, 1)) == 1


def test_prime_keys_take_the_portable_backend(each_backend):
    fn = DCF(8, width=2, cmp="ge", group="p61")
    assert backend._fast_for(fn.params) is None
    rnd = bytes(range(64))
    k0, _ = fn._gen_batch_with_randomness([5, 250], [1, 0], rnd)
    with backend.using("portable"):
        want, _ = fn._gen_batch_with_randomness([5, 250], [1, 0], rnd)
        want_eval = fn.eval_batch(want, [7, 7])
    assert k0.to_bytes() == want.to_bytes()
    np.testing.assert_array_equal(fn.eval_batch(k0, [7, 7]), want_eval)


def _function(v):
    if v["function"] == "DPF":
        return DPF(v["bits"], v["out_bits"], v["width"], signed=v["signed"], group=v["group"])
    return DCF(v["bits"], v["out_bits"], v["width"], cmp=v["cmp"], signed=v["signed"], group=v["group"])


@pytest.mark.parametrize("v", DOC["vectors"], ids=[f"{v['function']}-{v['bits']}-{v['width']}-{v['alpha']}" for v in DOC["vectors"]])
def test_known_answers(v):
    fn = _function(v)
    rnd = bytes.fromhex(v["randomness"])
    k0, k1 = fn._gen_with_randomness(v["alpha"], v["beta"] if fn.width > 1 else v["beta"][0], rnd)
    assert k0.to_bytes().hex() == v["key0"] and k1.to_bytes().hex() == v["key1"]
    d0, d1 = fn.key_from_bytes(bytes.fromhex(v["key0"])), fn.key_from_bytes(bytes.fromhex(v["key1"]))
    for x, s0, s1, val in zip(v["points"], v["shares0"], v["shares1"], v["values"]):
        y0, y1 = fn.eval(d0, x), fn.eval(d1, x)
        assert (list(y0) if fn.width > 1 else [y0]) == s0 and (list(y1) if fn.width > 1 else [y1]) == s1
        assert [(a + b) % P for a, b in zip(s0, s1)] == val


@pytest.mark.parametrize("v", DOC["bad_keys"], ids=[v["why"] for v in DOC["bad_keys"]])
def test_bad_key_vectors(v):
    with pytest.raises(KeyFormatError, match=v["match"]):
        _function(v).key_from_bytes(bytes.fromhex(v["key"]))


def test_vectors_cover_the_cases():
    assert DOC["prime"] == P and {v["group"] for v in DOC["vectors"]} == {"p61"}
    assert {v["cmp"] for v in DOC["vectors"]} == {"lt", "le", "gt", "ge", "eq"}
    assert any(v["bits"] == 64 and v["signed"] and v["alpha"] == -(1 << 63) for v in DOC["vectors"])
