"""F_p key format 2's rejection sampling (`fss.prg.element`) on every path that draws elements: with
the PRG made to hit p often, the portable backend's gen, eval_batch, eval_grid and eval_full still
equal the reference word for word and still reconstruct f. An honest PRG hits p with probability
2^-61 a word, so only a tampered one (the same in both: words whose low 6 bits are 42 get their low
61 bits set, about 1/64 of them) exercises the VALUE-word and LEAF-block resampling at all; the leaf
seed's words are forced in test_prime through a crafted seed correction, on every backend."""
from __future__ import annotations

import numpy as np
import pytest

import fss.portable as portable
import fss.prg as prg
import fss.reference as R
from fss import DCF, DPF

P = prg.M61


@pytest.fixture
def tampered(monkeypatch):
    """Both PRG paths (the reference's one block, the portable backend's ECB buffers) with 1 word in 64
    forced to p in its low 61 bits; yields the list of resampled sources."""
    one, mmo, resample = prg.expand_one, portable.mmo_blocks, prg.resample
    sources = []

    def expand_one(seed, role, j):
        x = one(seed, role, j)
        for k in (0, 64):
            if (x >> k) & 63 == 42:
                x |= P << k
        return x

    def mmo_blocks(inp, out):
        mmo(inp, out)
        out[(out & np.uint64(63)) == np.uint64(42)] |= np.uint64(P)

    def counted(seed, src):
        sources.append(src >> 20)  # the role the rejected word came from
        return resample(seed, src)

    monkeypatch.setattr(prg, "expand_one", expand_one)
    monkeypatch.setattr(R, "expand_one", expand_one)
    monkeypatch.setattr(portable, "mmo_blocks", mmo_blocks)
    monkeypatch.setattr(prg, "resample", counted)
    monkeypatch.setattr(portable, "resample", counted)
    yield sources


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["lt", "eq"])
def test_resampled_elements_agree_with_the_reference_and_reconstruct(tampered, width, kind):
    bits, n = 4, 12
    fn = DPF(bits, width=width, group="p61") if kind == "eq" else DCF(bits, width=width, cmp=kind, group="p61")
    p = fn.params
    rng = np.random.default_rng(width)  # alphas, payloads and roots of a deterministic test, not key randomness
    for trial in range(n):
        alpha, beta = int(rng.integers(0, 1 << bits)), [int(b) for b in rng.integers(0, P, width)]
        s0, s1 = (int.from_bytes(rng.bytes(16), "little") for _ in range(2))
        r0, r1 = R.gen(p, alpha, beta, s0, s1)
        roots = np.array([[[s0 & (2**64 - 1)], [s0 >> 64]], [[s1 & (2**64 - 1)], [s1 >> 64]]], np.uint64)
        k0, k1 = portable.gen_batch(p, np.array([alpha ^ p.input_xor], np.uint64), np.array(beta, np.uint64).reshape(width, 1), roots)
        assert k0.to_bytes()[16:] == R.encode(p, r0)[8:] and k1.to_bytes()[16:] == R.encode(p, r1)[8:]
        xs = np.arange(1 << bits, dtype=np.uint64)
        shares = []
        for r, k in ((r0, k0), (r1, k1)):
            want = np.array([R.eval(p, r, x) for x in range(1 << bits)], np.uint64)  # (x, width)
            many = k.select(np.zeros(1 << bits, np.int64))
            assert np.array_equal(portable.eval_batch(many, xs ^ np.uint64(p.input_xor)).T, want)
            assert np.array_equal(portable.eval_grid(k, 0, 1 << bits, False)[0], want[xs ^ np.uint64(p.input_xor)])
            if kind == "eq":
                assert np.array_equal(portable.eval_full(k).T, want)
            shares.append(want)
        total = [[(int(a) + int(b)) % P for a, b in zip(x0, x1)] for x0, x1 in zip(*shares)]
        assert total == [R.function_value(p, alpha, beta, x) for x in range(1 << bits)]
    # the tampering reached the PRG words of every source these parameters draw elements from (the leaf
    # seed's own words come from a seed correction here, so test_prime forces those)
    roles = set(tampered)
    assert (kind == "eq" or prg.ROLE_VALUE in roles) and (width <= 2 or prg.ROLE_LEAF in roles), roles
