"""Bad input gets a typed error with a clear message, never a crash or a silent wrong answer."""
import numpy as np
import pytest

from fss import DCF, DPF, FssError, KeyBatch, KeyMismatchError, ParameterError


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: DCF(0), "bits must lie in"),
        (lambda: DCF(65), "bits must lie in"),
        (lambda: DCF(8, 0), "out_bits must lie in"),
        (lambda: DCF(8, 65), "out_bits must lie in"),
        (lambda: DCF(8, 64, 0), "width must lie in"),
        (lambda: DCF(8, 64, 1 << 16), "width must lie in"),
        (lambda: DCF(8.0), "bits must be an int"),
        (lambda: DCF(True), "bits must be an int, got bool"),
        (lambda: DCF(8, cmp="eq"), "cmp must be one of"),
        (lambda: DCF(8, cmp="<>"), "cmp must be one of"),
        (lambda: DCF(8, signed=1), "signed must be a bool"),
        (lambda: DPF(8, width=-1), "width must lie in"),
    ],
)
def test_bad_parameters(build, message):
    with pytest.raises(ParameterError, match=message):
        build()


def test_errors_are_fss_errors_and_value_errors():
    with pytest.raises(FssError):
        DCF(0)
    with pytest.raises(ValueError):
        DCF(0)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda f: f.gen(256), r"alpha must lie in \[0, 255\], got 256"),
        (lambda f: f.gen(-1), r"alpha must lie in \[0, 255\], got -1"),
        (lambda f: f.gen(1.5), "alpha must be an int, got float"),
        (lambda f: f.gen(True), "alpha must be a single int"),
        (lambda f: f.gen("3"), "alpha must be an int, got str"),
        (lambda f: f.gen(3, beta=1 << 64), "beta must lie in"),
        (lambda f: f.gen(3, beta=-(1 << 63) - 1), "beta must lie in"),
        (lambda f: f.gen(3, beta=[1, 2]), "does not fit 1 keys of width 1"),
        (lambda f: f.gen(3, beta=0.5), "beta must be an int, got float"),
        (lambda f: f.gen_batch([1, 300]), "alpha must lie in"),
        (lambda f: f.gen_batch(np.array([1.0, 2.0])), "alpha must hold ints, got dtype float64"),
        (lambda f: f.gen_batch([[1, 2]]), "alphas must be one-dimensional"),
        (lambda f: f.gen_batch([1, 2], [1, 2, 3]), "does not fit 2 keys"),
        (lambda f: f.gen_batch(np.array([1, 2], dtype=np.uint64), np.array([1.0, 2.0])), "beta must hold ints"),
        (lambda f: f._gen_with_randomness(3, 1, b"short"), "need 32 bytes of randomness"),
    ],
)
def test_bad_gen_inputs(call, message):
    with pytest.raises(ParameterError, match=message):
        call(DCF(8))


def test_bad_eval_inputs():
    f = DCF(8)
    k0, _ = f.gen(3)
    b0, _ = f.gen_batch([1, 2, 3])
    with pytest.raises(ParameterError, match=r"x must lie in \[0, 255\], got 256"):
        f.eval(k0, 256)
    with pytest.raises(ParameterError, match="x must be a single int"):
        f.eval(k0, [1, 2])
    with pytest.raises(ParameterError, match="one point per key: 3 keys"):
        f.eval_batch(b0, [1, 2])
    with pytest.raises(ParameterError, match="points must lie in"):
        f.eval_sum(b0, [1, -2])
    with pytest.raises(ParameterError, match="points must be one-dimensional"):
        f.eval_sum(b0, [[1, 2]])
    with pytest.raises(ParameterError, match="expected a Key, got KeyBatch"):
        f.eval(b0, 1)
    with pytest.raises(ParameterError, match="expected a KeyBatch, got Key"):
        f.eval_sum(k0, [1])
    with pytest.raises(ParameterError, match="expected a Key, got bytes"):
        f.eval(k0.to_bytes(), 1)


def test_signed_domain_bounds():
    f = DCF(8, signed=True)
    f.gen(-128)
    f.gen(127)
    with pytest.raises(ParameterError, match=r"\[-128, 127\], got 128"):
        f.gen(128)
    with pytest.raises(ParameterError, match=r"got -129"):
        f.eval(f.gen(0)[0], -129)


@pytest.mark.parametrize(
    "other",
    [DCF(8, 32), DCF(8, 64, 2), DCF(8, cmp="le"), DCF(8, signed=True), DCF(9), DPF(8)],
)
def test_keys_of_other_parameters_are_refused(other):
    f = DCF(8)
    k0, _ = other.gen(3, 1)
    b0, _ = other.gen_batch([3, 4], 1)
    with pytest.raises(KeyMismatchError, match="used with DCF"):
        f.eval(k0, 1)
    with pytest.raises(KeyMismatchError, match="used with DCF"):
        f.eval_sum(b0, [1])


def test_batches_of_other_parties_or_parameters_do_not_mix():
    f = DCF(8)
    k0, k1 = f.gen_batch([1, 2])
    with pytest.raises(KeyMismatchError, match="cannot mix"):
        KeyBatch.concatenate([k0, k1])
    g0, _ = DCF(8, 32).gen_batch([1])
    with pytest.raises(KeyMismatchError, match="cannot mix"):
        KeyBatch.concatenate([k0, g0])
    with pytest.raises(ParameterError, match="at least one batch"):
        KeyBatch.concatenate([])


@pytest.mark.parametrize(
    "index,message",
    [
        (2, "key index 2 out of range for a batch of 2 keys"),
        (-3, "key index -3 out of range for a batch of 2 keys"),
        (np.int64(7), "key index 7 out of range"),
        (np.array([0, 5]), "key index 5 out of range for a batch of 2 keys"),
        ([-4, 1], "key index -4 out of range"),
    ],
)
def test_key_index_out_of_range_is_a_parameter_error(index, message):
    k0, _ = DCF(8).gen_batch([1, 2])
    with pytest.raises(ParameterError, match=message) as info:
        k0[index]
    assert isinstance(info.value, FssError) and isinstance(info.value, IndexError)  # old callers' except IndexError
    assert [k.to_bytes() for k in k0] == [k0[0].to_bytes(), k0[1].to_bytes()]  # iteration still stops at the end
    assert k0[-1].to_bytes() == k0[1].to_bytes()


def test_eval_full_is_limited():
    f = DPF(25)
    k0, _ = f.gen(1)
    with pytest.raises(ParameterError, match="bits <= 24"):
        f.eval_full(k0)


def test_empty_batches_work():
    f = DCF(8, 64, 2)
    k0, k1 = f.gen_batch([], 1)
    assert len(k0) == 0
    assert f.eval_sum(k0, [0, 5]).shape == (2, 2)
    assert not f.eval_sum(k0, [0, 5]).any()
    assert f.eval_batch(k0, []).shape == (0, 2)
    assert f.batch_from_bytes(k0.to_bytes()).to_bytes() == k0.to_bytes()


@pytest.mark.parametrize("n", [1, 15, 16, 17, 32])
def test_evaluation_never_changes_the_keys(n):
    """Regression: the portable walk once updated a one-group batch's root seeds in place."""
    from fss import backend

    f = DCF(12)
    k0, _ = f.gen_batch(np.arange(n), 1)
    before = k0.to_bytes()
    for name in backend.available():
        with backend.using(name):
            f.eval_batch(k0, np.arange(n))
            f.eval_sum(k0, [0, 7])
    assert k0.to_bytes() == before
