"""`fss.layout`: keys as rows (one single-key encoding per row) and as grouped arrays. Rows round-trip
with every loader, a row is refused exactly when `key_from_bytes` refuses it, rows are read where they
lie (slices of wider rows), and every bad argument is a typed error."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fss
from fss import DCF, DPF, FssError, KeyBatch, KeyFormatError, ParameterError, layout

from test_loaders import _batch, _same, functions


@settings(max_examples=60)
@given(functions(), st.integers(0, 40), st.integers(0, 2**32), st.integers(0, 24))
def test_rows_are_the_single_keys_and_decode_back_to_the_batch(fn, n, seed, extra):
    """Row k is `batch[k].to_bytes()`; the rows (as an array, as bytes end to end, and as the first
    columns of wider rows) decode to the batch, strictly and leniently alike."""
    for party, batch in enumerate(_batch(fn, n, seed)):
        rows = layout.key_rows(batch)
        assert rows.shape == (n, fn.key_size) and rows.dtype == np.uint8
        assert [rows[k].tobytes() for k in range(n)] == [batch[k].to_bytes() for k in range(n)]
        wide = np.full((n, fn.key_size + extra), 0xA5, np.uint8)
        assert layout.key_rows(batch, out=wide[:, :fn.key_size]) is not None
        assert (wide[:, fn.key_size:] == 0xA5).all()  # nothing written past the key
        for given_rows in (rows, rows.tobytes(), wide[:, :fn.key_size]):
            _same(layout.batch_from_rows(fn, given_rows, party), batch)
            found = layout.keys_from_rows(fn.params, given_rows, party)
            assert found.bad == {}
            _same(found.keys, batch)


@settings(max_examples=60)
@given(functions(), st.integers(1, 40), st.integers(0, 2**32), st.data())
def test_a_row_is_left_out_exactly_when_key_from_bytes_refuses_it(fn, n, seed, data):
    """Random bit flips in random rows: `keys_from_rows` leaves out the rows `key_from_bytes` refuses,
    with its reason, and returns the others' keys in order; `batch_from_rows` refuses the first."""
    batch = _batch(fn, n, seed)[0]
    rows = layout.key_rows(batch)
    for _ in range(data.draw(st.integers(1, 6))):
        k, byte, bit = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, fn.key_size - 1)), data.draw(st.integers(0, 7))
        rows[k, byte] ^= 1 << bit
    want_bad = {}
    for k in range(n):
        try:
            fn.key_from_bytes(rows[k].tobytes(), party=0)
        except KeyFormatError as exc:
            want_bad[k] = str(exc)
    found = layout.keys_from_rows(fn, rows, 0)
    assert found.bad == want_bad  # the same rows, and the same reasons
    good = [k for k in range(n) if k not in want_bad]
    assert found.keys.n == len(good)
    if good:
        _same(found.keys, fn.batch_from_keys([rows[k].tobytes() for k in good], 0))
    if want_bad:
        with pytest.raises(KeyFormatError):
            layout.batch_from_rows(fn, rows, 0)
    else:
        _same(layout.batch_from_rows(fn, rows, 0), found.keys)


def test_each_kind_of_bad_row_is_named_with_its_reason():
    dcf = DCF(bits=10, out_bits=20)
    k0, _ = dcf.gen_batch(np.arange(40))
    rows = layout.key_rows(k0)
    p = dcf.params
    rows[3, 8 + 16] |= 1  # reserved bit 0 of the first seed correction word
    rows[5, 8 + 16 * 11 + p.t_bytes - 1] |= 0x80  # past the 2 * 10 control bits
    rows[7, -1] |= 0x80  # past the 11 * 20 bits of payload corrections
    rows[9, 2] = 1  # another party's header
    rows[11, 0] = 9  # an unknown version
    rows[13, 1] |= 0x80  # a batch's header
    found = layout.keys_from_rows(dcf, rows, 0)
    assert list(found.bad) == [3, 5, 7, 9, 11, 13]
    assert "reserved bit" in found.bad[3] and "control-bit" in found.bad[5] and "payload" in found.bad[7]
    assert "party 1" in found.bad[9] and "version 9" in found.bad[11] and "kind" in found.bad[13]
    assert found.keys.n == 34
    with pytest.raises(KeyFormatError, match="row 1 .*party 1"):  # row 9 of the whole is row 1 of the slice
        layout.batch_from_rows(dcf, rows[8:10], 0)
    with pytest.raises(KeyFormatError, match="reserved bit"):
        layout.batch_from_rows(dcf, rows[:4], 0)


def test_p61_payload_corrections_must_be_below_p():
    dpf = DPF(bits=3, width=1, group="p61")
    k0, _ = dpf.gen_batch(np.arange(4))
    rows = layout.key_rows(k0)
    rows[1, -8:] = np.frombuffer(((1 << 61) - 1).to_bytes(8, "little"), np.uint8)  # p itself, in 61 bits
    found = layout.keys_from_rows(dpf, rows, 0)
    assert list(found.bad) == [1] and "mod p" in found.bad[1] and found.keys.n == 3


def test_no_rows_make_an_empty_batch():
    dcf = DCF(bits=6, width=2)
    for rows in (np.empty((0, dcf.key_size), np.uint8), b""):
        batch = layout.batch_from_rows(dcf, rows, 1)
        assert isinstance(batch, KeyBatch) and batch.n == 0 and batch.party == 1
        found = layout.keys_from_rows(dcf, rows, 1)
        assert found.keys.n == 0 and found.bad == {}
    empty = dcf.gen_batch(np.arange(0), [1, 1])[0]
    assert layout.key_rows(empty).shape == (0, dcf.key_size)


def test_all_rows_bad_leave_an_empty_batch():
    dcf = DCF(bits=5)
    k0, _ = dcf.gen_batch(np.arange(3))
    found = layout.keys_from_rows(dcf, layout.key_rows(k0), 1)  # party 0's keys read as party 1's
    assert sorted(found.bad) == [0, 1, 2] and found.keys.n == 0 and found.keys.party == 1


def test_rows_in_any_layout_are_read_alike():
    """Rows with a negative or overlapping stride, or a column stride, are copied first: the same keys."""
    dcf = DCF(bits=7, out_bits=32, width=3)
    k0, _ = dcf.gen_batch(np.arange(20), [1, 2, 3])
    rows = layout.key_rows(k0)
    _same(layout.batch_from_rows(dcf, rows[::-1][::-1], 0), k0)
    _same(layout.batch_from_rows(dcf, np.asfortranarray(rows), 0), k0)
    _same(layout.batch_from_rows(dcf, rows[::2], 0), k0.select(np.arange(0, 20, 2)))
    _same(layout.batch_from_rows(dcf, rows[::-1], 0), k0.select(np.arange(19, -1, -1)))


@pytest.mark.parametrize("fn", [DCF(bits=9, out_bits=32, width=2), DCF(bits=4, out_bits=13), DPF(bits=6, group="p61")], ids=str)
@pytest.mark.parametrize("n", [0, 1, 16, 17, 50])
def test_grouped_shapes_are_a_batchs_arrays(fn, n):
    batch = _batch(fn, n, n)[0]
    shapes = layout.grouped_shapes(fn, n)
    assert tuple(shapes) == layout.ARRAYS
    for name, (shape, dtype) in shapes.items():
        assert getattr(batch, name).shape == shape and getattr(batch, name).dtype == dtype
    assert shapes["seeds"][0][0] == layout.groups(n) == -(-n // layout.GROUP)
    zeros = [np.zeros(shape, dtype) for shape, dtype in shapes.values()]
    assert KeyBatch.from_grouped(fn.params, 0, n, *zeros).n == n


def test_key_formats_are_what_the_functions_take():
    assert layout.KEY_FORMATS == {"ring": (1,), "p61": (1, 2)}
    assert DCF(8, group="p61").params.version == layout.KEY_FORMATS["p61"][-1]
    assert DCF(8).params.version == layout.KEY_FORMATS["ring"][-1]
    assert fss.layout is layout and "layout" in fss.__all__


def test_bad_arguments_are_typed_errors():
    dcf = DCF(bits=5)
    k0, _ = dcf.gen_batch(np.arange(3))
    rows = layout.key_rows(k0)
    calls = [
        (ParameterError, lambda: layout.key_rows(k0[0])),  # a Key, not a batch
        (ParameterError, lambda: layout.key_rows(k0, out=np.empty((3, dcf.key_size), np.int64))),
        (ParameterError, lambda: layout.key_rows(k0, out=np.empty((2, dcf.key_size), np.uint8))),
        (ParameterError, lambda: layout.key_rows(k0, out=rows.copy()[:, :0])),
        (ParameterError, lambda: layout.key_rows(k0, out=np.frombuffer(rows.tobytes(), np.uint8).reshape(rows.shape))),
        (ParameterError, lambda: layout.batch_from_rows("DCF", rows, 0)),
        (ParameterError, lambda: layout.batch_from_rows(k0, rows, 0)),  # a batch is not a function
        (ParameterError, lambda: layout.batch_from_rows(dcf, rows, 2)),
        (ParameterError, lambda: layout.batch_from_rows(dcf, rows, None)),
        (ParameterError, lambda: layout.batch_from_rows(dcf, rows.astype(np.int16), 0)),
        (ParameterError, lambda: layout.batch_from_rows(dcf, rows[0], 0)),  # one row is 1-D: rows[None] or bytes
        (ParameterError, lambda: layout.keys_from_rows(dcf, [rows[0].tobytes()], 0)),
        (KeyFormatError, lambda: layout.batch_from_rows(dcf, rows[:, 1:], 0)),  # rows of another width
        (KeyFormatError, lambda: layout.keys_from_rows(dcf, rows.tobytes()[:-1], 0)),  # not whole keys
        (ParameterError, lambda: layout.grouped_shapes(dcf, -1)),
        (ParameterError, lambda: layout.grouped_shapes(dcf, 2.0)),
        (ParameterError, lambda: layout.grouped_shapes(None, 2)),
    ]
    for error, call in calls:
        with pytest.raises(error) as info:
            call()
        assert isinstance(info.value, FssError)


def test_a_key_or_a_strided_buffer_is_refused_with_a_typed_error():
    """Review of issue 43: a `Key` or `KeyBatch` (they carry params too) is not a function, and a
    non-contiguous memoryview raised numpy's BufferError; both are fss errors, and the function or its
    params and contiguous bytes still work."""
    fn = DCF(bits=8)
    k0, _ = fn.gen_batch(np.arange(5), 1)
    rows = layout.key_rows(k0)
    for not_a_function in (k0, k0[0]):
        with pytest.raises(ParameterError, match="expected a DCF"):
            layout.batch_from_rows(not_a_function, rows, 0)
    with pytest.raises(KeyFormatError, match="contiguous"):
        layout.batch_from_rows(fn, memoryview(rows.tobytes())[::2], 0)
    with pytest.raises(KeyFormatError, match="contiguous"):
        fn.batch_from_bytes(memoryview(k0.to_bytes() * 2)[::2], 0)
    for function in (fn, fn.params):
        assert layout.batch_from_rows(function, memoryview(rows.tobytes()), 0).to_bytes() == k0.to_bytes()
