"""The key format: sizes, round trips, and strict decoding of anything else."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fss import DCF, DPF, KeyBatch, KeyFormatError

from helpers import make


@pytest.mark.parametrize(
    "fn",
    [DCF(32), DCF(16, 32, 3), DCF(64, 64, 1, cmp="ge", signed=True), DCF(1, 1), DPF(20, 64, 1), DPF(64, 7, 5)],
)
def test_key_size_within_16_bytes_of_formula(fn):
    k0, _ = fn.gen(0, 1)
    assert len(k0.to_bytes()) == fn.key_size
    assert 0 <= fn.key_size - fn.params.formula_bits / 8 <= 16


def test_dcf_32_64_1_is_808_bytes_for_the_formulas_800():
    assert DCF(32, 64, 1).params.formula_bits == 800 * 8
    assert DCF(32, 64, 1).key_size == 808


@given(st.sampled_from(["lt", "le", "gt", "ge", "eq"]), st.integers(1, 64), st.integers(1, 64), st.integers(1, 4),
       st.booleans(), st.integers(0, 5))
def test_batch_round_trip_and_slicing(kind, bits, out_bits, width, signed, n):
    fn = make(kind, bits, out_bits, width, signed)
    lo, hi = fn.params.domain_range()
    alphas = np.linspace(lo, hi, n, dtype=np.float64).astype(object)
    alphas = [min(max(int(a), lo), hi) for a in alphas]
    k0, k1 = fn.gen_batch(alphas, -1)
    for batch in (k0, k1):
        data = batch.to_bytes()
        assert len(data) == 16 + n * fn.params.body_len
        back = fn.batch_from_bytes(data, party=batch.party)
        assert back.to_bytes() == data
        for i in range(n):
            key = fn.key_from_bytes(batch[i].to_bytes())
            assert key == batch[i]
            assert data[16 + i * fn.params.body_len : 16 + (i + 1) * fn.params.body_len] == key.to_bytes()[8:]
        assert KeyBatch.concatenate([batch.select(slice(0, n // 2)), batch.select(slice(n // 2, n))]).to_bytes() == data


@given(st.binary(max_size=900))
def test_random_bytes_raise_only_key_format_error(data):
    for fn in (DCF(32), DCF(3, 5, 2), DPF(8, 64, 1)):
        for decode in (fn.key_from_bytes, fn.batch_from_bytes):
            try:
                decode(data)
            except KeyFormatError:
                pass


@given(st.data())
def test_mutated_valid_keys_decode_or_raise_key_format_error(data):
    fn = data.draw(st.sampled_from([DCF(5, 7, 2), DCF(8), DPF(6, 3, 3, signed=True)]))
    k0, _ = fn.gen(0, 1)
    raw = bytearray(k0.to_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= 1 << data.draw(st.integers(0, 7))
    try:
        key = fn.key_from_bytes(bytes(raw))
    except KeyFormatError:
        return
    assert key.to_bytes() == bytes(raw)  # what decodes re-encodes to the same bytes: one encoding per key


def _valid(fn):
    k0, _ = fn.gen(3, 1)
    return bytearray(k0.to_bytes())


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda b: b.__setitem__(0, 2), "version"),
        (lambda b: b.__setitem__(1, 2), "kind"),
        (lambda b: b.__setitem__(1, 0x81), "kind"),
        (lambda b: b.__setitem__(2, 2), "party"),
        (lambda b: b.__setitem__(3, 6), "parameters"),
        (lambda b: b.__setitem__(4, 63), "parameters"),
        (lambda b: b.__setitem__(5, 1), "parameters"),
        (lambda b: b.__setitem__(5, 0x10), "parameters"),
        (lambda b: b.__setitem__(6, 3), "parameters"),
        (lambda b: b.__setitem__(8 + 16, b[8 + 16] | 1), "reserved bit"),
        (lambda b: b.append(0), "bytes"),
        (lambda b: b.pop(), "bytes"),
    ],
)
def test_each_bad_field_is_refused_with_a_message(mutate, message):
    fn = DCF(5, 7, 2)
    raw = _valid(fn)
    mutate(raw)
    with pytest.raises(KeyFormatError, match=message):
        fn.key_from_bytes(bytes(raw))


def test_nonzero_padding_is_refused():
    fn = DCF(5, 7, 2)  # 2*5 = 10 t bits -> 6 padding bits; 6*2*7 = 84 v bits -> 4 padding bits
    p = fn.params
    raw = _valid(fn)
    t_end = 8 + 16 * (1 + p.bits) + p.t_bytes - 1
    bad = bytearray(raw)
    bad[t_end] |= 0x80
    with pytest.raises(KeyFormatError, match="padding after the control-bit"):
        fn.key_from_bytes(bytes(bad))
    bad = bytearray(raw)
    bad[-1] |= 0x80
    with pytest.raises(KeyFormatError, match="padding after the payload"):
        fn.key_from_bytes(bytes(bad))


def test_party_filter_and_batch_header():
    fn = DCF(4)
    k0, k1 = fn.gen_batch([1, 2, 3])
    with pytest.raises(KeyFormatError, match="expected party 0"):
        fn.batch_from_bytes(k1.to_bytes(), party=0)
    with pytest.raises(KeyFormatError, match="expected party 1"):
        fn.key_from_bytes(k0[0].to_bytes(), party=1)
    data = bytearray(k0.to_bytes())
    data[8] = 4  # claims 4 keys, holds 3
    with pytest.raises(KeyFormatError, match="batch of 4 keys"):
        fn.batch_from_bytes(bytes(data))
    with pytest.raises(KeyFormatError, match="single key"):
        fn.key_from_bytes(bytes(k0.to_bytes()[:8]) + bytes(fn.params.body_len))
    with pytest.raises(KeyFormatError, match="expected bytes"):
        fn.key_from_bytes("not bytes")
    with pytest.raises(KeyFormatError, match="not a single key"):
        DPF(4).key_from_bytes(k0[0].to_bytes()[:1] + b"\x01" + k0[0].to_bytes()[2:])
    with pytest.raises(KeyFormatError, match="at least 16 bytes"):
        fn.batch_from_bytes(b"\x01\x81")


def test_batch_from_single_keys_matches_the_batch_and_refuses_others():
    fn = DCF(9, 32, 2)
    k0, k1 = fn.gen_batch([1, 200, 511], [3, 4])
    keys = [k0[i].to_bytes() for i in range(3)]
    assert fn.batch_from_keys(keys, 0).to_bytes() == k0.to_bytes()
    assert len(fn.batch_from_keys([], 0)) == 0
    with pytest.raises(KeyFormatError, match="party 0"):
        fn.batch_from_keys(keys[:2] + [k1[2].to_bytes()], 0)  # the other party's key
    with pytest.raises(KeyFormatError):
        fn.batch_from_keys(keys[:2] + [keys[2][:-1]], 0)
    bad = bytearray(keys[1])
    bad[8 + 16] |= 1  # a reserved bit: caught by the batch decode
    with pytest.raises(KeyFormatError, match="reserved bit"):
        fn.batch_from_keys([keys[0], bytes(bad)], 0)


@settings(max_examples=50)
@given(bits=st.integers(1, 63), count=st.one_of(st.integers(1, 140), st.integers(1020, 1100)), data=st.data())
def test_payload_bit_packing_equals_the_bit_by_bit_layout(bits, count, data):
    """`codec._pack` (shifts into words; a scatter above 1,024 corrections a key) writes the payload
    corrections' bits exactly as the layout says (value k's bit j at bit k * bits + j, least
    significant first), here built bit by bit with numpy's unpackbits; `_unpack` reads them back."""
    from fss import codec

    rows = data.draw(st.integers(1, 4))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))  # test values (drawing thousands from hypothesis is slow)
    vals = rng.integers(0, 2**64 - 1, size=(rows, count), dtype=np.uint64, endpoint=True)
    vals[0, :: 3] = np.uint64(2**64 - 1)  # every bit set, and none
    vals[-1, 1::3] = 0
    nbytes = (count * bits + 7) // 8
    bitwise = np.unpackbits(vals.astype("<u8").view(np.uint8).reshape(rows, -1), axis=1, bitorder="little")
    want = np.packbits(bitwise.reshape(rows, count, 64)[:, :, :bits].reshape(rows, -1), axis=1, bitorder="little")
    got = codec._pack(vals, bits, nbytes)
    assert got.shape == (rows, nbytes) and np.array_equal(got, want)
    np.testing.assert_array_equal(codec._unpack(got, bits, count), vals & np.uint64((1 << bits) - 1))
