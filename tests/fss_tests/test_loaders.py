"""Keys from their bytes alone (`fss.load_key`, `load_batch`, `load_keys`), batches through files
(`write_batch`, `read_batch`, mapped or streamed), the fast batch codec against the numpy one, typed
errors for anything that is not a key, and the deterministic testing hook (`fss.testing`)."""
import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fss
from fss import DCF, DPF, KeyFormatError, ParameterError, codec, loaders, testing

VECTORS = Path(__file__).parents[1] / "vectors"
CMP = ["lt", "le", "gt", "ge", "eq"]


@st.composite
def functions(draw):
    kind, bits, width, signed = draw(st.sampled_from(CMP)), draw(st.integers(1, 64)), draw(st.integers(1, 5)), draw(st.booleans())
    group = draw(st.sampled_from(["ring", "ring", "p61-1", "p61-2"]))
    kw = {"group": "p61", "version": int(group[-1])} if group != "ring" else {}
    out_bits = None if kw else draw(st.integers(1, 64))
    if kind == "eq":
        return DPF(bits, out_bits, width, signed=signed, **kw)
    return DCF(bits, out_bits, width, cmp=kind, signed=signed, **kw)


def _batch(fn, n, seed):
    """Both parties' batches of n keys with random alphas and payloads, from `seed`."""
    rng = np.random.default_rng(seed)
    lo, hi = fn.params.domain_range()
    alphas = [lo + int(v) % (hi - lo + 1) for v in rng.integers(0, 2**63, n)]
    betas = rng.integers(0, 2**63, (n, fn.width), dtype=np.uint64) * np.uint64(2) % np.uint64(fn.modulus) if fn.params.prime \
        else rng.integers(0, 2**64 - 1, (n, fn.width), dtype=np.uint64, endpoint=True) & np.uint64(fn.params.mask)
    return testing.gen_batch(fn, alphas, betas[:, 0] if fn.width == 1 else betas, seed=seed)


def _same(a, b):
    assert a.params == b.params and a.party == b.party and a.n == b.n
    for x, y in zip(a.logical(), b.logical()):
        np.testing.assert_array_equal(x, y)


@settings(max_examples=100)
@given(functions(), st.integers(0, 40), st.integers(0, 2**32))
def test_round_trips_through_every_loader_match_the_numpy_codec(fn, n, seed):
    batches = _batch(fn, n, seed)
    for batch in batches:
        data = batch.to_bytes()
        assert data == codec.encode_batch(fn.params, batch.party, batch.logical())  # the numpy path's bytes
        got_fn, back = fss.load_batch(data)
        assert got_fn.params == fn.params and type(got_fn) is type(fn)
        _same(back, batch)
        _same(fn.batch_from_bytes(bytearray(data)), numpy_decode(fn, data))
        keys = b"".join(batch[i].to_bytes() for i in range(n))
        if n:
            _same(fss.load_keys(keys).key, batch)
            k_fn, key = fss.load_key(batch[n // 2].to_bytes())
            assert k_fn.params == fn.params and key == batch[n // 2]
        _same(fn.batch_from_keys([batch[i].to_bytes() for i in range(n)], batch.party), batch)
        out = io.BytesIO()
        assert fss.write_batch(batch, out) == len(data) and out.getvalue() == data
        out.seek(0)
        _same(fss.read_batch(out, function=fn, party=batch.party).key, batch)


def numpy_decode(fn, data):
    return fss.KeyBatch.from_logical(fn.params, *codec.decode_batch(fn.params, data))


def test_small_chunks_stream_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(loaders, "CHUNK_BYTES", 1)  # one group of 16 keys a chunk
    for fn in (DCF(12, 7, 3, cmp="ge"), DPF(9, group="p61"), DCF(20, group="p61", version=1)):
        k0, _ = _batch(fn, 83, 5)
        path = tmp_path / "k.bin"
        fss.write_batch(k0, path)
        assert path.read_bytes() == k0.to_bytes()
        with open(path, "rb") as f:
            _same(fss.read_batch(f).key, k0)
        stream = io.BytesIO(k0.to_bytes() + k0.to_bytes())
        first, second = fss.read_batch(stream).key, fss.read_batch(stream).key  # batches one after the other
        _same(first, k0), _same(second, k0)
        assert stream.read() == b""


def test_mixed_prime_format_versions_load_as_they_are():
    for version in (1, 2):
        fn = DCF(16, group="p61", version=version)
        k0, k1 = fn.gen(alpha=300, beta=5)
        (f0, a), (f1, b) = fss.load_key(k0.to_bytes()), fss.load_key(k1.to_bytes())
        assert f0.params.version == f1.params.version == version
        assert f0.reconstruct(f0.eval(a, 299), f1.eval(b, 299)) == 5 and f0.reconstruct(f0.eval(a, 300), f1.eval(b, 300)) == 0


def test_every_known_answer_vector_loads_from_its_bytes_alone():
    """The interop vectors (docs/key-format.md): each key loads without its function, which the loader
    reads from the header, and evaluates to the recorded shares; no bad key loads as a key of the
    function it claims to be for."""
    for name in ("fss_v1", "fss_prime_v1", "fss_prime_v2"):
        doc = json.loads((VECTORS / f"{name}.json").read_text())
        for v in doc["vectors"]:
            for party in (0, 1):
                fn, key = fss.load_key(bytes.fromhex(v[f"key{party}"]))
                assert (fn.bits, fn.out_bits, fn.width, fn.params.cmp, fn.params.signed) == \
                       (v["bits"], v["out_bits"], v["width"], v["cmp"], v["signed"])
                assert fn.group == v.get("group", "ring") and fn.params.version == v.get("version", 1)
                got = [fn.eval(key, x) for x in v["points"]]
                assert [list(y) if fn.width > 1 else [y] for y in got] == v[f"shares{party}"]
                one = fss.load_batch(fss.KeyBatch.concatenate([key.batch]).to_bytes()).key
                np.testing.assert_array_equal(fn.eval_batch(one, [v["points"][0]]).reshape(-1), v[f"shares{party}"][0])
        for v in doc["bad_keys"]:  # bad for the function they describe: refused, or a key of another one
            kw = {"group": v["group"], "version": v.get("version", 1)} if "group" in v else {}
            want = DPF(v["bits"], v["out_bits"], v["width"], signed=v["signed"], **kw) if v["function"] == "DPF" \
                else DCF(v["bits"], v["out_bits"], v["width"], cmp=v["cmp"], signed=v["signed"], **kw)
            try:
                fn, _ = fss.load_key(bytes.fromhex(v["key"]))
            except KeyFormatError:
                continue
            assert fn.params != want.params, v["why"]


def test_the_testing_hook_replays_the_vectors_and_names_batches_by_a_seed():
    v = json.loads((VECTORS / "fss_v1.json").read_text())["vectors"][0]
    fn = DCF(v["bits"], v["out_bits"], v["width"], cmp=v["cmp"], signed=v["signed"])
    k0, k1 = testing.gen(fn, v["alpha"], v["beta"][0], randomness=bytes.fromhex(v["randomness"]))
    assert (k0.to_bytes().hex(), k1.to_bytes().hex()) == (v["key0"], v["key1"])
    a = testing.gen_batch(fn, [1, 2, 3], 1, seed=7)
    assert a[0].to_bytes() == testing.gen_batch(fn, [1, 2, 3], 1, seed=7)[0].to_bytes()
    assert a[0].to_bytes() != testing.gen_batch(fn, [1, 2, 3], 1, seed=8)[0].to_bytes()
    rnd = testing.expand_seed(7, 96)
    assert testing.gen(fn, 2, 1, randomness=rnd[32:64])[1] == a[1][1]
    assert testing.gen_batch(fn, [1, 2, 3], 1, randomness=rnd)[0].to_bytes() == a[0].to_bytes()
    for bad in (dict(), dict(seed=1, randomness=rnd), dict(seed=-1), dict(seed=1.5), dict(randomness=rnd[:-1])):
        with pytest.raises(ParameterError):
            testing.gen_batch(fn, [1, 2, 3], 1, **bad)
    with pytest.raises(ParameterError):
        testing.gen("DCF", 1, randomness=bytes(32))


def test_a_memory_mapped_batch_evaluates_as_the_original(tmp_path):
    fn = DCF(32, 64, cmp="le")
    k0, k1 = _batch(fn, 1000, 3)
    xs = np.random.default_rng(4).integers(0, 2**32, 1000, dtype=np.uint64)
    for batch in (k0, k1):
        path = tmp_path / f"p{batch.party}.keys"
        fss.write_batch(batch, str(path))
        got_fn, mapped = fss.read_batch(path)
        np.testing.assert_array_equal(got_fn.eval_batch(mapped, xs), fn.eval_batch(batch, xs))
        np.testing.assert_array_equal(got_fn.eval_sum(mapped, xs[:50]), fn.eval_sum(batch, xs[:50]))
    ref = fn.reconstruct(fn.eval_batch(k0, xs), fn.eval_batch(k1, xs))
    m0, m1 = fss.read_batch(tmp_path / "p0.keys").key, fss.read_batch(tmp_path / "p1.keys").key
    np.testing.assert_array_equal(fn.reconstruct(fn.eval_batch(m0, xs), fn.eval_batch(m1, xs)), ref)


def test_truncated_extended_or_foreign_files_raise_key_format_error(tmp_path):
    fn = DCF(10, 13, 2)
    k0, _ = _batch(fn, 20, 1)
    data = k0.to_bytes()
    for cut in (0, 1, 7, 8, 15, 16, 17, len(data) // 2, len(data) - 1):
        with pytest.raises(KeyFormatError):
            fss.load_batch(data[:cut])
        with pytest.raises(KeyFormatError):
            fss.read_batch(io.BytesIO(data[:cut]))
        (tmp_path / "cut").write_bytes(data[:cut])
        with pytest.raises(KeyFormatError):
            fss.read_batch(tmp_path / "cut")
    (tmp_path / "long").write_bytes(data + b"\0")
    with pytest.raises(KeyFormatError, match="bytes"):
        fss.read_batch(tmp_path / "long")
    with pytest.raises(KeyFormatError, match="single key"):
        fss.load_batch(k0[0].to_bytes())
    with pytest.raises(KeyFormatError, match="batch"):
        fss.load_key(data)
    with pytest.raises(KeyFormatError, match="expected"):
        fss.read_batch(io.BytesIO(data), function=DCF(10, 13, 3))
    with pytest.raises(KeyFormatError, match="party"):
        fss.read_batch(io.BytesIO(data), party=1)
    with pytest.raises(KeyFormatError, match="key 3 is not"):
        fss.load_keys(b"".join(k0[i].to_bytes() if i != 3 else _batch(fn, 4, 2)[1][3].to_bytes() for i in range(5)))
    for bad in ("keys", None, 3, np.zeros(4, np.int64)):
        with pytest.raises(KeyFormatError):
            fss.load_batch(bad)
    with pytest.raises(ParameterError):
        fss.read_batch(3)
    with pytest.raises(ParameterError):
        fss.write_batch(k0[0], io.BytesIO())
    with pytest.raises(ParameterError):
        fss.function_of("DCF(8)")


@pytest.mark.parametrize("offset,message", [
    (lambda p: 16 + p.body_len * 5 + 16, r"reserved bit 0 .*\(key 5 "),  # a seed correction's low byte
    (lambda p: 16 + p.body_len * 6 + 16 * (p.bits + 1) + p.t_bytes - 1, r"control-bit corrections \(key 6 "),
    (lambda p: 16 + p.body_len * 8 - 1, r"payload corrections \(key 7 "),
])
def test_corrupt_bodies_name_the_first_bad_key(offset, message):
    fn = DCF(5, 7, 3)  # 5 levels: 6 bits of control-bit padding; 6 x 3 x 7 = 126 bits of payloads: 2 of padding
    k0, _ = _batch(fn, 40, 9)
    raw = bytearray(k0.to_bytes())
    raw[offset(fn.params)] |= 0x81
    with pytest.raises(KeyFormatError, match=message):
        fss.load_batch(bytes(raw))
    with pytest.raises(KeyFormatError, match=message):
        fss.read_batch(io.BytesIO(bytes(raw)))


def test_an_unreduced_prime_payload_is_refused():
    fn = DCF(4, group="p61")
    k0, _ = _batch(fn, 3, 2)
    raw = bytearray(k0.to_bytes())
    end = 16 + 2 * fn.params.body_len  # key 1's payload corrections end there
    vals = codec._unpack(np.frombuffer(bytes(raw[end - fn.params.v_bytes:end]), np.uint8)[None], 61, fn.params.v_levels)
    vals[0, -1] = fss.params.PRIME  # 61 ones: p itself
    raw[end - fn.params.v_bytes:end] = codec._pack(vals, 61, fn.params.v_bytes)[0].tobytes()
    with pytest.raises(KeyFormatError, match=r"not reduced .*\(key 1 "):
        fss.load_batch(bytes(raw))


@settings(max_examples=60)
@given(st.data())
def test_mutated_batches_decode_as_the_numpy_codec_does(data):
    """A flipped bit anywhere: both decoders refuse, or both give the same keys (which re-encode to the
    same bytes: one encoding per batch)."""
    fn = data.draw(st.sampled_from([DCF(5, 7, 2), DCF(9, group="p61"), DPF(6, 3, 3, signed=True), DCF(3, 64, 1, cmp="gt")]))
    k0, _ = _batch(fn, 19, data.draw(st.integers(0, 99)))
    raw = bytearray(k0.to_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    raw = bytes(raw)
    try:
        old = numpy_decode(fn, raw)
    except KeyFormatError:
        old = None
    try:
        new = fss.load_batch(raw).key
    except KeyFormatError:
        new = None
    if new is not None and new.params != fn.params:  # a flipped header bit made another function's batch
        assert old is None
        return
    assert (old is None) == (new is None)
    if new is not None:
        _same(new, old)
        assert new.to_bytes() == raw


@settings(max_examples=60)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_key_format_error(data):
    for load in (fss.load_key, fss.load_batch, fss.load_keys):
        try:
            load(data)
        except KeyFormatError:
            pass
    try:
        fss.read_batch(io.BytesIO(data))
    except KeyFormatError:
        pass
