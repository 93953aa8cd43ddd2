"""Gates on masked inputs (`fss.gates`) against a cleartext model: exhaustive on 4 bits (every x, every
r_in, every c and every p <= q), hypothesis properties up to 64 bits with random masks and the domain's
edges, both output groups, batch against single, typed errors, and the committed known answers."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fss import ComparisonGate, FssError, IntervalGate, KeyMismatchError, MultiIntervalGate, ParameterError, ReluGate
from fss.gates import GateKey, GateKeyBatch, sign_gate

VECTORS = Path(__file__).parents[1] / "vectors"
sys.path.insert(0, str(VECTORS))
from generate_gates import cleartext, make_gate  # noqa: E402

P = (1 << 61) - 1
N4 = 16


def signed4(v):
    return v - N4 if v >= N4 // 2 else v


def run_all(gate, xs, r_ins):
    """Keys for every r_in, each evaluated at its x_hat = x + r_in: the reconstructed outputs minus r_out."""
    _, r_out = gate.random_masks(len(r_ins))
    k0, k1 = gate.gen_batch(r_ins, r_out)
    x_hat = (np.asarray(xs, np.uint64) + np.asarray(r_ins, np.uint64)) & np.uint64((1 << gate.bits) - 1)
    y = gate.reconstruct(gate.eval_batch(k0, x_hat), gate.eval_batch(k1, x_hat))
    return [(int(a) - int(o)) % gate.modulus for a, o in zip(np.ravel(y), np.ravel(r_out))]


X4, R4 = (a.ravel().astype(np.uint64) for a in np.meshgrid(np.arange(N4), np.arange(N4)))  # all (x, r_in) pairs
CONFIGS = [("ring", None), ("ring", 1), ("ring", 9), ("p61", None)]


@pytest.mark.parametrize("group,out_bits", CONFIGS)
@pytest.mark.parametrize("signed", [False, True])
def test_comparison_every_x_every_mask_every_c(group, out_bits, signed):
    values = [signed4(int(x)) if signed else int(x) for x in X4]
    lo = -8 if signed else 0
    for c in range(lo, lo + N4 + 1):
        gate = ComparisonGate(4, c, out_bits, signed=signed, group=group)
        assert run_all(gate, X4, R4) == [int(v < c) for v in values], c


@pytest.mark.parametrize("signed", [False, True])
def test_interval_every_x_every_mask_every_p_le_q(signed):
    values = [signed4(int(x)) if signed else int(x) for x in X4]
    lo = -8 if signed else 0
    for p in range(lo, lo + N4):
        for q in range(p, lo + N4):
            assert run_all(IntervalGate(4, p, q, signed=signed), X4, R4) == [int(p <= v <= q) for v in values], (p, q)


@pytest.mark.parametrize("group", ["ring", "p61"])
def test_multi_interval_every_interval_from_one_key(group):
    intervals = [(p, q) for p in range(N4) for q in range(p, N4)]
    gate = MultiIntervalGate(4, intervals, group=group)
    _, r_out = gate.random_masks(N4 * N4)
    k0, k1 = gate.gen_batch(R4, r_out)
    x_hat = (X4 + R4) & np.uint64(N4 - 1)
    y = gate.reconstruct(gate.eval_batch(k0, x_hat), gate.eval_batch(k1, x_hat))
    got = (y.astype(object) - r_out.astype(object)) % gate.modulus
    want = np.array([[int(p <= x <= q) for p, q in intervals] for x in X4.tolist()], dtype=object)
    assert (got == want).all()


@pytest.mark.parametrize("bits,out_bits,group", [(4, None, "ring"), (4, 1, "ring"), (4, 3, "ring"), (4, 9, "ring"),
                                                 (4, None, "p61"), (1, None, "ring"), (2, 64, "ring"), (3, None, "p61")])
def test_relu_every_x_every_mask(bits, out_bits, group):
    n = 1 << bits
    xs, rs = (a.ravel().astype(np.uint64) for a in np.meshgrid(np.arange(n), np.arange(n)))
    gate = ReluGate(bits, out_bits, group=group)
    want = [max(int(x) - n if x >= n // 2 else int(x), 0) % gate.modulus for x in xs]
    assert run_all(gate, xs, rs) == want


def test_sign_gate_is_x_nonnegative():
    gate = sign_gate(4)
    assert repr(gate) == "IntervalGate(bits=4, intervals=[(0, 7)], signed, out_bits=4)"
    assert run_all(gate, X4, R4) == [int(signed4(int(x)) >= 0) for x in X4]


# --- properties up to 64 bits ------------------------------------------------------------------------

BITS = st.one_of(st.integers(1, 32), st.sampled_from([1, 2, 31, 32, 63, 64]))
GROUPS = st.sampled_from([("ring", None), ("ring", 1), ("ring", 64), ("p61", None)])


def edgy(lo, hi):
    """Integers in [lo, hi], half of them at the edges (lo, hi, 0, -1, 1 and the signed midpoints)."""
    edges = [v for v in (lo, lo + 1, hi, hi - 1, 0, -1, 1, (lo + hi + 1) // 2) if lo <= v <= hi]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


@st.composite
def masked(draw, signed):
    """(bits, group, out_bits, x in the domain, r_in, r_out index seed)."""
    bits = draw(BITS)
    group, out_bits = draw(GROUPS)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    x = draw(edgy(lo, hi))
    r_in = draw(edgy(0, (1 << bits) - 1))
    return bits, group, out_bits, lo, hi, x, r_in


def check(gate, x, r_in, r_out, want):
    x_hat = (x + r_in) % (1 << gate.bits)
    k0, k1 = gate.gen(r_in, r_out)
    assert gate.reconstruct(gate.eval(k0, x_hat), gate.eval(k1, x_hat)) == (want + r_out) % gate.modulus


@settings(max_examples=60)
@given(st.booleans().flatmap(lambda s: st.tuples(st.just(s), masked(s))), st.data())
def test_comparison_property(case, data):
    signed, (bits, group, out_bits, lo, hi, x, r_in) = case
    c = data.draw(edgy(lo, hi + 1) | st.sampled_from([x, x + 1, hi + 1]))
    gate = ComparisonGate(bits, c, out_bits, signed=signed, group=group)
    r_out = data.draw(edgy(0, gate.modulus - 1))
    check(gate, x, r_in, r_out, int(x < c))


@settings(max_examples=60)
@given(st.booleans().flatmap(lambda s: st.tuples(st.just(s), masked(s))), st.data())
def test_interval_property(case, data):
    signed, (bits, group, out_bits, lo, hi, x, r_in) = case
    p, q = sorted([data.draw(edgy(lo, hi) | st.just(x)), data.draw(edgy(lo, hi) | st.just(x))])
    gate = IntervalGate(bits, p, q, out_bits, signed=signed, group=group)
    r_out = data.draw(edgy(0, gate.modulus - 1))
    check(gate, x, r_in, r_out, int(p <= x <= q))


@settings(max_examples=60)
@given(masked(True), st.data())
def test_relu_property(case, data):
    bits, group, out_bits, _, _, x, r_in = case
    gate = ReluGate(bits, out_bits, group=group)
    r_out = data.draw(edgy(0, gate.modulus - 1))
    check(gate, x, r_in, r_out, max(x, 0) % gate.modulus)


def test_greater_or_equal_by_negation():
    """The ComparisonGate docstring's [x >= c]: party 0 takes 1 - y0, party 1 -y1, mask -r_out."""
    gate = ComparisonGate(16, 300)
    for x in (0, 299, 300, 65535):
        r_in, r_out = gate.random_masks()
        k0, k1 = gate.gen(r_in, r_out)
        x_hat = (x + r_in) % 65536
        ge = gate.reconstruct(1 - gate.eval(k0, x_hat), -gate.eval(k1, x_hat))
        assert ge == (int(x >= 300) - r_out) % 65536


# --- batch against single, randomness ------------------------------------------------------------

@pytest.mark.parametrize("gate", [ComparisonGate(20, 777), IntervalGate(64, 5, 1 << 40, group="p61"),
                                  MultiIntervalGate(12, [(0, 5), (6, 4095)]), ReluGate(24), ReluGate(40, group="p61")],
                         ids=repr)
def test_batch_equals_single(gate):
    n = 37
    r_in, r_out = gate.random_masks(n)
    x_hat = np.frombuffer(np.random.default_rng(1).bytes(8 * n), np.uint64) & np.uint64((1 << gate.bits) - 1)
    rnd = [np.random.default_rng(k).bytes(gate._random_bytes(1)) for k in range(n)]
    roots, rest = b"".join(r[:32] for r in rnd), b"".join(r[32:] for r in rnd)
    k0, k1 = gate._gen_batch_with_randomness(r_in, r_out, roots + rest)
    y0, y1 = gate.eval_batch(k0, x_hat), gate.eval_batch(k1, x_hat)
    for i in range(n):
        outs = r_out[i].tolist()
        s0, s1 = gate._gen_with_randomness(int(r_in[i]), outs, rnd[i])
        assert s0.dcf_key.to_bytes() == k0[i].dcf_key.to_bytes() and s1.dcf_key.to_bytes() == k1[i].dcf_key.to_bytes()
        assert s0.shares == k0[i].shares and s1.shares == k1[i].shares
        single = [gate.eval(s, int(x_hat[i])) for s in (s0, s1)]
        assert single == [gate.eval(k[i], int(x_hat[i])) for k in (k0, k1)]
        assert np.array_equal(np.array(single, dtype=np.uint64), np.array([y0[i], y1[i]], dtype=np.uint64))


def test_party_0s_key_does_not_depend_on_the_output_mask():
    """With the same randomness, party 0's key (DCF key and mask shares) is the same whatever r_out: its
    share is drawn independently; party 1's carries the mask."""
    for gate in (ComparisonGate(16, 99), ReluGate(16), IntervalGate(8, 1, 2, group="p61")):
        rnd = bytes(range(gate._random_bytes(1)))
        a0, a1 = gate._gen_with_randomness(5, 0, rnd)
        b0, b1 = gate._gen_with_randomness(5, 12345, rnd)
        assert a0.dcf_key.to_bytes() == b0.dcf_key.to_bytes() and a0.shares == b0.shares
        assert a1.shares[0] != b1.shares[0]


def test_gen_draws_fresh_randomness_and_masks_are_in_range():
    gate = ReluGate(32, group="p61")
    r_in, r_out = gate.random_masks()
    (a0, _), (b0, _) = gate.gen(r_in, r_out), gate.gen(r_in, r_out)
    assert a0.dcf_key.to_bytes() != b0.dcf_key.to_bytes() and a0.shares != b0.shares
    r_in, r_out = gate.random_masks(1000)
    assert r_in.dtype == np.uint64 and int(r_in.max()) < 1 << 32 and int(r_out.max()) < P and len(set(r_out.tolist())) == 1000
    r_in, r_out = MultiIntervalGate(8, [(0, 1), (2, 3), (4, 5)]).random_masks(4)
    assert r_out.shape == (4, 3) and int(r_out.max()) < 256


# --- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("build,message", [
    (lambda: ComparisonGate(0, 1), "bits must lie in"),
    (lambda: ComparisonGate(65, 1), "bits must lie in"),
    (lambda: ComparisonGate(8, 257), r"c must lie in \[0, 256\]"),
    (lambda: ComparisonGate(8, -129, signed=True), r"c must lie in \[-128, 128\]"),
    (lambda: ComparisonGate(8, 1.5), "c must be an int"),
    (lambda: ComparisonGate(8, 1, signed=1), "signed must be a bool"),
    (lambda: IntervalGate(8, 5, 4), "p = 5 > q = 4"),
    (lambda: IntervalGate(8, -1, 4), "p must lie in"),
    (lambda: MultiIntervalGate(8, []), "at least one interval"),
    (lambda: MultiIntervalGate(8, [(1, 2, 3)]), "must be a pair"),
    (lambda: MultiIntervalGate(8, 5), "intervals must be a sequence"),
    (lambda: ReluGate(8, 0), "out_bits must lie in"),
    (lambda: ReluGate(8, 32, group="p61"), "out_bits = 61"),
    (lambda: ReluGate(8, group="xor"), "group must be one of"),
])
def test_bad_parameters(build, message):
    with pytest.raises(ParameterError, match=message):
        build()


@pytest.mark.parametrize("call,message", [
    (lambda g, k: g.gen(256, 0), "r_in must lie in"),
    (lambda g, k: g.gen(-1, 0), "r_in must lie in"),
    (lambda g, k: g.gen(1, 256), "r_out must lie in"),
    (lambda g, k: g.gen(True, 0), "r_in must be an int"),
    (lambda g, k: g.gen(1, [1, 2]), "does not fit"),
    (lambda g, k: g.gen_batch([1, 2], [3]), "does not fit 2 keys"),
    (lambda g, k: g.gen_batch([[1, 2]], [[3, 4]]), "one-dimensional"),
    (lambda g, k: g._gen_with_randomness(1, 2, b"short"), "bytes of randomness"),
    (lambda g, k: g.eval(k, 256), "x_hat must lie in"),
    (lambda g, k: g.eval(k, "1"), "x_hat must be an int"),
    (lambda g, k: g.eval(k.dcf_key, 1), "expected a GateKey"),
    (lambda g, k: g.eval_batch(k, [1]), "expected a GateKeyBatch"),
    (lambda g, k: g.eval_batch(k.batch, [1, 2]), "one x_hat per key"),
    (lambda g, k: g.eval_batch(k.batch, [1.5]), "x_hat must be an int"),
    (lambda g, k: k.batch["0"], "indexed by an int"),
    (lambda g, k: g.random_masks(-1), "n must lie in"),
])
def test_bad_calls(call, message):
    gate = ComparisonGate(8, 10)
    key, _ = gate.gen(3, 4)
    with pytest.raises(ParameterError, match=message):
        call(gate, key)


def test_keys_of_another_gate_are_refused():
    key, _ = ComparisonGate(8, 10).gen(3, 4)
    for other in (ComparisonGate(8, 11), ComparisonGate(8, 10, 16), ComparisonGate(8, 10, signed=True), IntervalGate(8, 0, 9)):
        with pytest.raises(KeyMismatchError, match="used with"):
            other.eval(key, 5)
    assert ComparisonGate(8, 10).eval(key, 5) in range(256)  # an equal gate takes them
    batch, _ = ReluGate(8).gen_batch([1, 2], [3, 4])
    with pytest.raises(FssError):
        ReluGate(8, group="p61").eval_batch(batch, [0, 0])
    with pytest.raises(FssError, match="out of range"):
        batch[2]


# --- known answers -------------------------------------------------------------------------------

DOC = json.loads((VECTORS / "gates_v1.json").read_text())


@pytest.mark.parametrize("v", DOC["vectors"], ids=lambda v: f"{v['describe']}-{v['r_in']}")
def test_known_answers(v):
    gate = make_gate(v)
    assert repr(gate) == v["describe"]
    r_out = v["r_out"][0] if len(v["r_out"]) == 1 else v["r_out"]
    k0, k1 = gate._gen_with_randomness(v["r_in"], r_out, bytes.fromhex(v["randomness"]))
    assert [k0.dcf_key.to_bytes().hex(), k1.dcf_key.to_bytes().hex()] == [v["dcf_key0"], v["dcf_key1"]]
    assert [list(k0.shares), list(k1.shares)] == [v["mask_shares0"], v["mask_shares1"]]
    parsed = [GateKey(GateKeyBatch(v["describe"], b, gate.dcf.key_from_bytes(bytes.fromhex(v[f"dcf_key{b}"]), b).batch,
                                   np.array([v[f"mask_shares{b}"]], np.uint64))) for b in (0, 1)]
    for pt in v["points"]:
        assert pt["x_hat"] == (pt["x"] + v["r_in"]) % (1 << gate.bits) and pt["value"] == cleartext(gate, pt["x"])
        for b, key in enumerate(parsed):
            y = gate.eval(key, pt["x_hat"])
            assert (list(y) if isinstance(y, tuple) else [y]) == pt[f"shares{b}"]
        total = [(a + b) % gate.modulus for a, b in zip(pt["shares0"], pt["shares1"])]
        assert total == [(val + o) % gate.modulus for val, o in zip(pt["value"], v["r_out"])]


def test_known_answers_cover_the_cases():
    gates = {v["gate"] for v in DOC["vectors"]}
    assert gates == {"ComparisonGate", "IntervalGate", "MultiIntervalGate", "ReluGate"}
    assert {v.get("group", "ring") for v in DOC["vectors"]} == {"ring", "p61"}
    assert {v["bits"] for v in DOC["vectors"]} >= {64, 5} and any(v.get("signed") for v in DOC["vectors"])
    assert any(v["r_in"] == (1 << v["bits"]) - 1 for v in DOC["vectors"]) and any(v["r_in"] == 0 for v in DOC["vectors"])
