"""Key equality: equal iff the same bytes, compared in constant time (`hmac.compare_digest`)."""
import secrets

from hypothesis import given, settings
from hypothesis import strategies as st

import fss.keys
from fss import DCF, DPF

F = DCF(16, 64, 2)
K0, K1 = F.gen(1234, (5, 6))


def _flipped(key, index, bit):
    data = bytearray(key.to_bytes())
    data[index] ^= 1 << bit
    return F.key_from_bytes(bytes(data))


def test_equal_iff_same_bytes():
    assert K0 == F.key_from_bytes(K0.to_bytes()) and hash(K0) == hash(F.key_from_bytes(K0.to_bytes()))
    assert K0 != K1  # the other party's key
    assert K0 != F.gen(1234, (5, 6))[0]  # same function and points, fresh seeds
    assert DCF(16, 64, 2).key_from_bytes(K0.to_bytes()) == K0  # another (equal) function object


@given(index=st.integers(8, 8 + 15), bit=st.integers(0, 7))
@settings(max_examples=40, deadline=None)
def test_one_flipped_seed_bit_makes_keys_unequal(index, bit):
    other = _flipped(K0, index, bit)  # the root seed: bytes 8 .. 23 after the header
    assert other != K0 and K0 != other and not (other == K0)


def test_other_types_are_not_implemented():
    assert K0.__eq__(K0.to_bytes()) is NotImplemented
    assert K0.__eq__(K0.batch) is NotImplemented
    assert K0 != K0.to_bytes() and K0 != object() and K0 is not None
    assert DPF(16).gen(3)[0] != K0  # a key of another function: other bytes


def test_comparison_goes_through_compare_digest(monkeypatch):
    calls = []
    real = fss.keys.hmac.compare_digest

    def spy(a, b):
        calls.append((type(a), type(b), len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(fss.keys.hmac, "compare_digest", spy)
    other = F.key_from_bytes(K0.to_bytes())
    assert K0 == other and K0 != K1
    assert calls == [(bytes, bytes, F.key_size, F.key_size)] * 2


def test_keys_from_the_csprng_compare_by_content():
    alphas = {secrets.randbelow(1 << 16) for _ in range(4)}
    keys = [F.gen(a)[0] for a in alphas]
    copies = [F.key_from_bytes(k.to_bytes()) for k in keys]
    assert [[a == b for b in copies] for a in keys] == [[i == j for j in range(len(keys))] for i in range(len(keys))]
