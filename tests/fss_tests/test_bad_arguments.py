"""Every public entry point answers a bad argument with an `fss` error (a `ParameterError`), never a
bare TypeError, ValueError, AttributeError, OverflowError or SystemError from deeper down."""
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fss
from fss import DCF, DPF, ComparisonGate, FssError, KeyBatch, ParameterError, backend, testing

# Values that are not ints (nor int arrays): each must be refused, not coerced or crashed on.
NOT_INTS = [None, "x", "3", 2.0, np.float64(1.0), b"x", object(), {}, [1, "a"], True, 1.5 + 0j]


@pytest.fixture(scope="module")
def made():
    f = DCF(8)
    k0, _ = f.gen(3)
    b0, _ = f.gen_batch([1, 2, 3])
    return f, k0, b0


def _typed(call, value, match=None):
    with pytest.raises(ParameterError, match=match) as info:
        call(value)
    assert isinstance(info.value, FssError)
    assert str(info.value)  # a message, not an empty error


@pytest.mark.parametrize("value", NOT_INTS)
def test_reconstruct_refuses_non_int_shares(made, value):
    f = made[0]
    _typed(lambda v: f.reconstruct(1, v), value, "share1")
    _typed(lambda v: f.reconstruct(v, 1), value, "share0")
    _typed(lambda v: f.reconstruct(np.array([1, 2], np.uint64), v), value, "share1")
    _typed(lambda v: DCF(8, group="p61").reconstruct(v, 1), value, "share0")
    _typed(lambda v: ComparisonGate(8, 5).reconstruct(1, v), value, "share1")


def test_reconstruct_issue_example_and_shapes(made):
    f = made[0]
    with pytest.raises(ParameterError, match="share1 must be an int, got str"):
        f.reconstruct(1, "x")
    with pytest.raises(ParameterError, match="integer array, got dtype float64"):
        f.reconstruct(np.array([1.0]), np.array([1], np.uint64))
    with pytest.raises(ParameterError, match=r"shapes \(2,\) and \(3,\) do not match"):
        f.reconstruct(np.zeros(2, np.uint64), np.zeros(3, np.uint64))
    with pytest.raises(ParameterError, match="lengths 2 and 3"):
        DCF(8, 64, 2).reconstruct((1, 2), (1, 2, 3))
    with pytest.raises(ParameterError, match="two tuples"):
        DCF(8, 64, 2).reconstruct((1, 2), 5)
    with pytest.raises(ParameterError, match="signed must be a bool"):
        f.reconstruct(1, 2, signed=1)


def test_reconstruct_still_accepts_what_it_did(made):
    f = made[0]
    assert f.reconstruct(1, -2) == (1 << 64) - 1
    assert f.reconstruct(1, -2, signed=True) == -1
    assert f.reconstruct(np.uint64(5), np.int64(6)) == 11
    assert DCF(8, 64, 2).reconstruct((1, 2), [3, 4]) == (4, 6)
    np.testing.assert_array_equal(f.reconstruct(np.array([1, 2], np.uint64), [3, -4]), [4, (1 << 64) - 2])
    obj = np.array([1 << 63, 5], dtype=object)  # as examples/masked_comparison.py passes them
    np.testing.assert_array_equal(DCF(8, group="p61").reconstruct(np.array([2, 3], np.uint64), obj),
                                  [((1 << 63) + 2) % ((1 << 61) - 1), 8])


@given(a=st.integers(-(1 << 70), 1 << 70), b=st.integers(-(1 << 70), 1 << 70), out_bits=st.integers(1, 64))
@settings(max_examples=60, deadline=None)
def test_reconstruct_of_ints_is_the_sum_mod_the_modulus(a, b, out_bits):
    f = DCF(8, out_bits)
    assert f.reconstruct(a, b) == (a + b) % (1 << out_bits)
    v = f.reconstruct(a, b, signed=True)
    assert -(1 << (out_bits - 1)) <= v < 1 << (out_bits - 1) and (v - a - b) % (1 << out_bits) == 0


@given(value=st.one_of(st.floats(), st.text(max_size=3), st.none(), st.booleans(), st.binary(max_size=3),
                       st.lists(st.floats(), min_size=1, max_size=3)))
@settings(max_examples=60, deadline=None)
def test_reconstruct_refuses_any_non_int(value):
    with pytest.raises(ParameterError):
        DCF(8).reconstruct(1, value)


@pytest.mark.parametrize("value", NOT_INTS + [0, -1, 1 << 40, np.float64(2.0)])
def test_set_threads_refuses_bad_counts(value):
    before = backend.threads()
    _typed(backend.set_threads, value, "threads must")
    assert backend.threads() == before


def test_set_threads_issue_example():
    with pytest.raises(ParameterError, match="threads must be an int, got float"):
        backend.set_threads(2.0)


@pytest.mark.parametrize("value", NOT_INTS + ["avx", "AUTO"])
def test_set_backend_and_using_refuse_bad_names(value):
    _typed(backend.set_backend, value)
    _typed(lambda v: backend.using(v).__enter__(), value)


@pytest.mark.parametrize("value", NOT_INTS[1:] + [2, -1, 1 << 70])  # None means "either party" where optional
def test_party_arguments_are_0_or_1(made, value):
    f, k0, b0 = made
    _typed(lambda v: f.key_from_bytes(k0.to_bytes(), v), value, "party must be 0 or 1")
    _typed(lambda v: f.batch_from_bytes(b0.to_bytes(), v), value, "party must be 0 or 1")
    _typed(lambda v: f.batch_from_keys([k0.to_bytes()], v), value, "party must be 0 or 1")
    _typed(lambda v: fss.load_keys(k0.to_bytes(), v), value, "party must be 0 or 1")
    _typed(lambda v: fss.read_batch(io.BytesIO(b0.to_bytes()), None, v), value, "party must be 0 or 1")
    _typed(lambda v: KeyBatch.from_grouped(f.params, v, 3, b0.seeds, b0.cw_seed, b0.cw_t, b0.cw_v), value,
           "party must be 0 or 1")


def test_party_none_is_refused_where_required(made):
    f, k0, b0 = made
    _typed(lambda v: f.batch_from_keys([k0.to_bytes()], v), None, "party must be 0 or 1, got None")
    _typed(lambda v: KeyBatch.from_grouped(f.params, v, 3, b0.seeds, b0.cw_seed, b0.cw_t, b0.cw_v), None,
           "party must be 0 or 1, got None")
    assert f.key_from_bytes(k0.to_bytes(), None).to_bytes() == k0.to_bytes()  # optional: either party


@pytest.mark.parametrize("value", [None, 2.0, object(), 5, np.float64(1.0), True])
def test_batch_from_keys_needs_a_sequence(made, value):
    _typed(lambda v: made[0].batch_from_keys(v, 0), value, "keys must be a sequence")


@pytest.mark.parametrize("value", [None, "x", b"x", 2.5, object(), {}, [1, "a"], [0.0], np.array([0.5]),
                                   np.array([True]), True])
def test_batch_indices_must_be_ints(made, value):
    b0 = made[2]
    _typed(lambda v: b0[v], value, "key indices must be ints")
    _typed(b0.select, value, "key indices must be ints")


def test_batch_index_beyond_int64_is_a_key_index_error(made):
    with pytest.raises(fss.KeyIndexError):
        made[2].select([1 << 70])
    with pytest.raises(fss.KeyIndexError):
        made[2].select(np.array([1 << 63], np.uint64))
    assert made[2][[0, 2]].n == 2 and made[2][np.array([1], np.uint8)].n == 1  # ints of any kind still index


@pytest.mark.parametrize("value", [None, "x", 2.0, b"x", 5, np.float64(1.0), True, {}, [1, "a"], [[1]]])
def test_concatenate_needs_batches(made, value):
    b0 = made[2]
    _typed(KeyBatch.concatenate, value, "concatenate needs")
    _typed(lambda v: KeyBatch.concatenate([b0, v]), value, "concatenate needs KeyBatch")


@pytest.mark.parametrize("value", [[1, "a"], {}, ["lt"], 3])
def test_unhashable_or_non_string_cmp(value):
    _typed(lambda v: DCF(8, cmp=v), value, "cmp must be one of")


@pytest.mark.parametrize("value", NOT_INTS + [-1, 1 << 70])
def test_expand_seed_size(value):
    _typed(lambda v: testing.expand_seed(b"seed", v), value, "size must")


@pytest.mark.parametrize("value", NOT_INTS)
def test_constructors_and_gates_refuse_non_ints(value):
    for build in (DCF, DPF, lambda v: ComparisonGate(v, 1), lambda v: ComparisonGate(8, v),
                  lambda v: fss.ReluGate(v), lambda v: DPF(8, width=v)):
        _typed(build, value)
    if value is not None:  # out_bits=None is the default
        _typed(lambda v: DCF(8, v), value)
