"""One party's key alone does not depend on alpha: every key bit that is not structurally fixed is a
fair coin, with the same frequency for alpha = 0 and alpha = 2^bits - 1 (and the payload)."""
import math

import numpy as np
import pytest

from fss import DCF, DPF


def _chi2_sf(x: float, k: int) -> float:
    """Upper tail of chi-square with k degrees of freedom (Wilson-Hilferty normal approximation)."""
    z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _free_bits(fn, batch) -> np.ndarray:
    """(n, positions) bits of the key bodies, without the reserved and padding bits."""
    p = fn.params
    raw = np.frombuffer(batch.to_bytes(), np.uint8, offset=16).reshape(len(batch), p.body_len)
    bits = np.unpackbits(raw, axis=1, bitorder="little")
    keep = np.ones(bits.shape[1], bool)
    for level in range(p.bits):
        keep[8 * (16 + 16 * level)] = False  # bit 0 of each seed correction word is always zero
    t_start = 8 * 16 * (1 + p.bits)
    keep[t_start + 2 * p.bits : t_start + 8 * p.t_bytes] = False
    v_start = t_start + 8 * p.t_bytes
    keep[v_start + p.v_levels * p.width * p.out_bits :] = False
    return bits[:, keep]


def _pvalues(f0: np.ndarray, f1: np.ndarray, n: int) -> list[float]:
    """p-values that the bit counts f0, f1 (per position, n keys each) are fair coins alike: an
    omnibus chi-square per alpha and for the difference, and the largest single-position difference
    (Bonferroni over positions), which catches one leaking bit among thousands."""
    k = f0.size
    out = [_chi2_sf(float((((f - n / 2) / math.sqrt(n / 4)) ** 2).sum()), k) for f in (f0, f1)]
    diff = (f0 - f1) / math.sqrt(n / 2)
    out.append(_chi2_sf(float((diff**2).sum()), k))
    out.append(min(1.0, k * math.erfc(float(np.abs(diff).max()) / math.sqrt(2))))
    return out


def _counts(fn, party: int, n: int) -> list[np.ndarray]:
    lo, hi = fn.params.domain_range()
    return [
        _free_bits(fn, fn.gen_batch(np.full(n, alpha), beta)[party]).sum(axis=0, dtype=np.int64)
        for alpha, beta in ((lo, 1), (hi, fn.params.mask))
    ]


N = 4000


@pytest.mark.parametrize("fn", [DCF(8, 16, 1), DCF(6, 8, 3, cmp="le"), DPF(10, 12, 1)], ids=repr)
@pytest.mark.parametrize("party", [0, 1])
def test_key_bits_do_not_depend_on_alpha(fn, party):
    f0, f1 = _counts(fn, party, N)
    assert min(_pvalues(f0, f1, N)) > 1e-5


def test_the_statistic_sees_one_leaking_bit():
    """Power check: the same test flags keys in which one bit position follows alpha 60% of the time."""
    fn = DCF(8, 16, 1)
    f0, f1 = _counts(fn, 0, N)
    rng = np.random.default_rng(7)  # simulates the leak; no key randomness comes from here
    f1 = f1.copy()
    f1[100] = int((rng.random(N) < 0.6).sum())
    assert _pvalues(f0, f1, N)[-1] < 1e-5
