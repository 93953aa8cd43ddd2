"""DCF and DPF with payloads in F_p, p = 2^61 - 1 (group "p61"): every alpha and every x on small
domains, agreement with the reference on random large ones, the strict codec, known answers, and
that prime keys never mix with keys over Z_{2^k}."""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fss import DCF, DPF, KeyFormatError, ParameterError, backend
from fss import field as F
from fss import prg
from fss import reference as R

from helpers import CMPS

pytestmark = pytest.mark.usefixtures("each_backend")

P = F.P
VECTORS = Path(__file__).parents[1] / "vectors"
DOCS = {v: json.loads((VECTORS / f"fss_prime_v{v}.json").read_text()) for v in (1, 2)}  # key format versions


def make(kind, bits, width=1, signed=False, version=None):
    if kind == "eq":
        return DPF(bits, width=width, signed=signed, group="p61", version=version)
    return DCF(bits, width=width, cmp=kind, signed=signed, group="p61", version=version)


def truth(kind, alphas, xs, betas):
    a, x = alphas.astype(object), xs.astype(object)
    holds = {"lt": x < a, "le": x <= a, "gt": x > a, "ge": x >= a, "eq": x == a}[kind].astype(bool)
    return np.where(holds[:, None], betas, np.uint64(0)).astype(np.uint64)


def rows(fn, shares):
    return shares.reshape(shares.shape[0], fn.width)


@pytest.mark.parametrize("kind", CMPS + ("eq",))
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("bits", [1, 2, 3, 5])
@pytest.mark.parametrize("width, version", [(1, 2), (2, 2), (3, 2), (1, 1), (3, 1)])
def test_every_alpha_every_x(kind, signed, bits, width, version):
    fn = make(kind, bits, width, signed, version)
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
    kind=st.sampled_from(CMPS + ("eq",)), bits=st.integers(1, 64), width=st.integers(1, 4), signed=st.booleans(),
    version=st.sampled_from([1, 2]), data=st.data(), rnd=st.binary(min_size=32, max_size=32),
)
def test_agrees_with_the_reference(kind, bits, width, signed, version, data, rnd):
    fn = make(kind, bits, width, signed, version)
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
    assert header[4] == 61 and header[5] & 0x10 and header[0] == 2  # key format version 2, the default
    old = DCF(9, width=2, cmp="ge", group="p61", version=1)
    o0, _ = old.gen_batch(np.arange(3), 1)
    assert o0[0].to_bytes()[0] == 1 and old.batch_from_bytes(o0.to_bytes(), 0).to_bytes() == o0.to_bytes()
    with pytest.raises(KeyFormatError, match="version 1, but .*has version 2"):
        fn.key_from_bytes(o0[0].to_bytes())  # one task, one format: a server parses only its own
    with pytest.raises(KeyFormatError, match="version 2, but .*has version 1"):
        old.batch_from_bytes(k0.to_bytes())


def test_versions_are_validated_and_differ_only_over_the_prime_field():
    assert DCF(5, group="p61").params.version == 2 and DCF(5).params.version == 1
    assert DCF(5, group="p61", version=1).params != DCF(5, group="p61").params
    for bad in (0, 3, True, "2", 2.0):
        with pytest.raises(ParameterError, match="key format version"):
            DCF(5, group="p61", version=bad)
    with pytest.raises(ParameterError, match="version 1, got 2"):
        DPF(5, version=2)  # the ring has one format
    assert "version=1" in DCF(5, group="p61", version=1).params.describe()
    v1, v2 = DCF(10, width=2, group="p61", version=1).params, DCF(10, width=2, group="p61").params
    assert (v1.expand_blocks, v1.leaf_blocks, v2.expand_blocks, v2.leaf_blocks) == (6, 2, 4, 0)
    assert DCF(10, width=3, group="p61").params.leaf_blocks == 2 and DCF(10, width=3, group="p61", version=1).params.leaf_blocks == 3


def test_elements_are_exactly_uniform_by_rejection():
    """A word's low 61 bits are the element unless they are p (all ones): then `prg.resample` of the
    expanded seed at that word's source, the same in the reference, the portable backend's numpy
    and whatever `_elements` is handed."""
    from fss import portable

    seed = 0x0123456789ABCDEF_FEDCBA9876543210
    words = np.array([[P, 5, P | (7 << 61)], [0, (1 << 64) - 1, P - 1]], np.uint64)
    got = portable._elements(words.copy(), np.uint64(seed & (2**64 - 1)), np.uint64(seed >> 64), prg.ROLE_VALUE, np.arange(3))
    want = [[prg.element(int(w), seed, prg.source(prg.ROLE_VALUE, j)) for j, w in enumerate(row)] for row in words]
    assert got.tolist() == want
    assert want[0][1] == 5 and want[1][0] == 0 and want[1][2] == P - 1
    assert want[0][0] == prg.resample(seed, prg.source(prg.ROLE_VALUE, 0)) < P
    assert want[0][2] == prg.resample(seed, prg.source(prg.ROLE_VALUE, 2)) < P
    assert want[0][0] != want[0][2]  # a source per word: distinct draws


def _rejecting_key(fn, word: int):
    """A key (of the party whose control bit is 1 above alpha's leaf) whose leaf seed on alpha's path
    has its word `word` all ones in the element's 61 bits: a last seed correction chosen for it (the
    key is no longer half of a DCF pair, but every implementation must still give it the same shares)."""
    p, alpha = fn.params, 11
    r = R.gen(p, alpha, [3] * p.width, 0x1234 << 70 | 99, 0x5678 << 70 | 77)
    a = alpha ^ p.input_xor
    for key in r:
        s, t = key.seed, key.party
        for i in range(p.bits - 1):
            d = (a >> (p.bits - 1 - i)) & 1
            s_next, t_next, _ = R._expand(p, s, d)
            s, t = (s_next ^ key.cw_seed[i], t_next ^ key.cw_t[i][d]) if t else (s_next, t_next)
        if t:
            raw = R._expand(p, s, a & 1)[0]
            target = raw | (P << (1 + 61 * word))
            key.cw_seed[-1] = raw ^ target
            assert R.convert(p, target)[word] < P and (prg.seed_word(target, word) & P) == P
            return fn.key_from_bytes(R.encode(p, key)), key
    raise AssertionError("no party has t = 1 above alpha's leaf")


@pytest.mark.parametrize("width, word", [(1, 0), (2, 0), (2, 1)])
def test_a_rejected_leaf_element_is_resampled_on_every_backend(width, word):
    """Leaf elements are the only ones a test can force to p (through a seed correction): the
    reference resamples them, and every backend's eval, eval_grid and eval_grid_sums agree with it
    (a grid kernel flags the rejection and hands the batch to the portable backend)."""
    fn = DCF(5, width=width, cmp="lt", group="p61")
    key, ref = _rejecting_key(fn, word)
    xs = list(range(32))
    want = [R.eval(fn.params, ref, x) for x in xs]
    got = [list(np.atleast_1d(fn.eval(key, x))) for x in xs]
    assert got == want
    honest = fn.gen_batch(np.arange(40) % 32, [5] * width if width > 1 else 5)[ref.party]
    mixed = [honest[i].to_bytes() for i in range(40)]
    mixed[3] = mixed[37] = key.to_bytes()  # the kernels leave out these two, the portable backend walks them
    batch = fn.batch_from_keys(mixed, ref.party)
    grid = fn.eval_grid(batch, 32).reshape(40, 32, width)
    assert grid[3].tolist() == grid[37].tolist() == want
    with backend.using("portable"):
        np.testing.assert_array_equal(grid, fn.eval_grid(batch, 32).reshape(40, 32, width))
    if width == 2:
        from fss import portable
        from fss._linear import sums_of

        w = (np.arange(3 * 32, dtype=np.uint64).reshape(3, 32, 1) * np.uint64(0x9E3779B97F4A7C15)) % np.uint64(P)
        offs = np.array([0, 0, 1])
        got = backend.eval_grid_sums(batch, 0, 32, False, w, offs)
        for a, b in zip(got, sums_of(portable.eval_grid(batch, 0, 32, False), w, offs)):
            np.testing.assert_array_equal(a, b)


def _function(v):
    version = v.get("version", 1)  # fss_prime_v1.json predates the field
    if v["function"] == "DPF":
        return DPF(v["bits"], v["out_bits"], v["width"], signed=v["signed"], group=v["group"], version=version)
    return DCF(v["bits"], v["out_bits"], v["width"], cmp=v["cmp"], signed=v["signed"], group=v["group"], version=version)


ALL_VECTORS = [v for doc in DOCS.values() for v in doc["vectors"]]
BAD_KEYS = [v for doc in DOCS.values() for v in doc["bad_keys"]]


@pytest.mark.parametrize("v", ALL_VECTORS,
                         ids=[f"v{v.get('version', 1)}-{v['function']}-{v['bits']}-{v['width']}-{v['alpha']}" for v in ALL_VECTORS])
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


@pytest.mark.parametrize("v", BAD_KEYS, ids=[f"v{v.get('version', 1)}-{v['why']}" for v in BAD_KEYS])
def test_bad_key_vectors(v):
    with pytest.raises(KeyFormatError, match=v["match"]):
        _function(v).key_from_bytes(bytes.fromhex(v["key"]))


@pytest.mark.parametrize("version", [1, 2])
def test_vectors_cover_the_cases(version):
    DOC = DOCS[version]
    assert {v.get("version", 1) for v in DOC["vectors"] + DOC["bad_keys"]} == {version}
    assert DOC["prime"] == P and {v["group"] for v in DOC["vectors"]} == {"p61"}
    assert {v["cmp"] for v in DOC["vectors"]} == {"lt", "le", "gt", "ge", "eq"}
    assert any(v["bits"] == 64 and v["signed"] and v["alpha"] == -(1 << 63) for v in DOC["vectors"])
