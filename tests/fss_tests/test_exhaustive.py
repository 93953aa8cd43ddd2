"""Every alpha and every x on small domains, for every comparison, DPF, signed and unsigned."""
import numpy as np
import pytest

from fss import reference as R

from helpers import CMPS, add, as_rows, make, truth

pytestmark = pytest.mark.usefixtures("each_backend")

KINDS = CMPS + ("eq",)
SHAPES = [(64, 1), (1, 1), (13, 2), (32, 3)]


def _all_pairs(fn):
    lo, hi = fn.params.domain_range()
    dom = np.arange(lo, hi + 1, dtype=np.int64)
    alphas = np.repeat(dom, dom.size)
    xs = np.tile(dom, dom.size)
    return dom, alphas, xs


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("bits", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("out_bits,width", SHAPES)
def test_every_alpha_every_x(kind, signed, bits, out_bits, width):
    fn = make(kind, bits, out_bits, width, signed)
    dom, alphas, xs = _all_pairs(fn)
    rng = np.random.default_rng(bits * 1000 + out_bits)  # payload choice only, not key randomness
    betas = rng.integers(0, 1 << min(out_bits, 63), size=(dom.size, width), dtype=np.uint64)
    betas[0] = fn.params.mask  # the largest payload
    k0, k1 = fn.gen_batch(dom, betas if width > 1 else betas[:, 0])
    idx = np.repeat(np.arange(dom.size), dom.size)
    b0, b1 = k0.select(idx), k1.select(idx)
    y = add(fn, as_rows(fn, fn.eval_batch(b0, xs)), as_rows(fn, fn.eval_batch(b1, xs)))
    np.testing.assert_array_equal(y, truth(fn, alphas, xs, betas[idx]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", [1, 3, 5])
def test_eval_sum_counts_everything(kind, bits):
    """eval_sum over keys for every alpha at every point equals the number of alphas satisfying f."""
    fn = make(kind, bits, 64, 1, False)
    dom = np.arange(1 << bits)
    k0, k1 = fn.gen_batch(dom, 1)
    got = add(fn, fn.eval_sum(k0, dom), fn.eval_sum(k1, dom))
    want = [sum(1 for a in dom if {"lt": x < a, "le": x <= a, "gt": x > a, "ge": x >= a, "eq": x == a}[kind]) for x in dom]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.uint64))


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("bits,out_bits,width", [(1, 64, 1), (3, 8, 2), (5, 64, 3), (8, 17, 1)])
def test_dpf_eval_full_every_alpha(signed, bits, out_bits, width):
    fn = make("eq", bits, out_bits, width, signed)
    lo, hi = fn.params.domain_range()
    for alpha in range(lo, hi + 1):
        beta = [(alpha * 7 + e + 1) & fn.params.mask for e in range(width)]
        k0, k1 = fn.gen(alpha, beta if width > 1 else beta[0])
        full = as_rows(fn, add(fn, fn.eval_full(k0), fn.eval_full(k1)))
        want = np.zeros((1 << bits, width), np.uint64)
        want[alpha % (1 << bits)] = beta
        np.testing.assert_array_equal(full, want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("bits,out_bits,width", [(1, 64, 1), (2, 5, 2), (3, 64, 3)])
def test_reference_every_alpha_every_x(kind, signed, bits, out_bits, width):
    """The oracle itself, checked against the definition, and the fast eval against the oracle."""
    fn = make(kind, bits, out_bits, width, signed)
    p = fn.params
    lo, hi = p.domain_range()
    for alpha in range(lo, hi + 1):
        beta = [(3 * alpha + 5 * e + 1) & p.mask for e in range(width)]
        seeds = (alpha + 11) * 0x9E3779B97F4A7C15 & ((1 << 128) - 1), (alpha + 13) * 0xC2B2AE3D27D4EB4F
        r0, r1 = R.gen(p, alpha, beta, seeds[0], seeds[1] & ((1 << 128) - 1))
        k0 = fn.key_from_bytes(R.encode(p, r0))
        for x in range(lo, hi + 1):
            s0, s1 = R.eval(p, r0, x), R.eval(p, r1, x)
            assert [(a + b) & p.mask for a, b in zip(s0, s1)] == R.function_value(p, alpha, beta, x)
            fast = fn.eval(k0, x)
            assert list(fast if width > 1 else [fast]) == s0
