"""The two parties' batches from one gen share their correction arrays (no copy of up to ~800 MB at
10^6 keys), so every batch's arrays are read-only: editing or wiping party 0's batch raises instead of
silently changing party 1's."""
import numpy as np
import pytest

from fss import DCF, DPF, ComparisonGate, KeyBatch, backend

ARRAYS = ("seeds", "cw_seed", "cw_t", "cw_v")
TIERS = sorted({"portable", backend.available()[-1]})


def _writes():
    """In-place edits a caller might try on one array: assignment, a wipe, an augmented operator."""
    def fill(a):
        a.fill(0)

    def assign(a):
        a[...] = 0

    def augment(a):
        a ^= a.dtype.type(1)

    def copyto(a):
        np.copyto(a, np.zeros_like(a))
    return [fill, assign, augment, copyto]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("fn", [DCF(16, 64), DCF(12, 32, 3, cmp="ge"), DPF(10, 64, 2), DCF(9, group="p61", width=5)],
                         ids=repr)
def test_editing_one_partys_batch_cannot_change_the_other(tier, fn):
    with backend.using(tier):
        k0, k1 = fn.gen_batch(np.arange(37) % (1 << fn.bits), 5)
    assert any(np.shares_memory(getattr(k0, a), getattr(k1, a)) for a in ARRAYS[1:])  # what makes it matter
    before0, before1 = k0.to_bytes(), k1.to_bytes()
    xs = np.arange(37)[::-1] % (1 << fn.bits)
    shares1 = fn.eval_batch(k1, xs)
    for name in ARRAYS:
        for write in _writes():
            with pytest.raises(ValueError, match="read-only"):
                write(getattr(k0, name))
    assert k1.to_bytes() == before1 and k0.to_bytes() == before0
    np.testing.assert_array_equal(fn.eval_batch(k1, xs), shares1)


def test_every_construction_path_gives_read_only_arrays():
    f = DCF(8, 64, 2)
    k0, k1 = f.gen(3, (1, 2))
    b0, _ = f.gen_batch([1, 2, 3], 1)
    batches = [k0.batch, k1.batch, b0, b0.select([0, 2]), b0[1:], b0[0].batch, KeyBatch.concatenate([b0, b0]),
               f.batch_from_bytes(b0.to_bytes()), f.key_from_bytes(k0.to_bytes()).batch,
               KeyBatch.from_logical(f.params, 0, *b0.logical()),
               ComparisonGate(8, 5).gen_batch([1, 2], [3, 4])[1].dcf]
    for b in batches:
        for name in ARRAYS:
            assert not getattr(b, name).flags.writeable, (b, name)


def test_from_grouped_copies_nothing_and_leaves_the_callers_arrays_alone():
    f = DCF(8)
    b0, _ = f.gen_batch(list(range(20)))
    mine = [a.copy() for a in (b0.seeds, b0.cw_seed, b0.cw_t, b0.cw_v)]
    again = KeyBatch.from_grouped(f.params, 0, 20, *mine)
    for name, a in zip(ARRAYS, mine):
        assert a.flags.writeable and np.shares_memory(getattr(again, name), a)
        assert not getattr(again, name).flags.writeable
    assert again.to_bytes() == b0.to_bytes()


def test_logical_returns_writable_copies():
    f = DCF(8)
    b0, b1 = f.gen_batch([4, 5])
    before = b1.to_bytes()
    for a in b0.logical():
        assert a.flags.writeable
        a.fill(0)
    assert b1.to_bytes() == before and b0.logical()[1].any()
