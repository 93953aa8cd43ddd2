"""zCDP releases: the exact discrete Gaussian (Canonne, Kamath, Steinke, "The Discrete Gaussian for
Differential Privacy", NeurIPS 2020, Algorithm 3) on a binary tree.

The sampler uses only integer and rational arithmetic (Python ints and Fractions) and uniform
integers from the OS CSPRNG (`secrets.randbelow`, the central release) or from a server's AES PRF
keystream per node (`prf_dgauss`, the two-server release), so no floating point touches the sampling
path. It is pure Python: about 10^4 to 10^5 samples a second, enough for trees of up to ~2^16 leaves.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import ParameterError
from .mechanisms import TreeMechanism, check_relation
from .tree import TreeShape

_MAX_DEN = 1 << 20


RandBelow = Callable[[int], int]  # m -> a uniform integer in [0, m)


def _bern_exp(gamma: Fraction, randbelow: RandBelow) -> int:
    """Bernoulli(exp(-gamma)) for a rational gamma >= 0 (CKS 2020, Algorithm 1)."""
    while gamma > 1:
        if not _bern_exp(Fraction(1), randbelow):
            return 0
        gamma -= 1
    num, den = gamma.numerator, gamma.denominator
    k = 1
    while randbelow(den * k) < num:  # Bernoulli(gamma / k)
        k += 1
    return k % 2


def _dlaplace_int(t: int, randbelow: RandBelow) -> int:
    """DLap(t) for an integer t >= 1 (CKS 2020, Algorithm 2 with s = 1)."""
    while True:
        u = randbelow(t)
        if not _bern_exp(Fraction(u, t), randbelow):
            continue
        v = 0
        while _bern_exp(Fraction(1), randbelow):
            v += 1
        y = u + t * v
        b = randbelow(2)
        if b == 1 and y == 0:
            continue
        return -y if b else y


def dgauss_one(sigma2: Fraction, randbelow: RandBelow = secrets.randbelow) -> int:
    """One exact sample of the discrete Gaussian N_Z(0, sigma2): P(y) proportional to
    exp(-y^2 / (2 sigma2)) on the integers (CKS 2020, Algorithm 3), from uniform integers
    `randbelow(m)` (the OS CSPRNG by default)."""
    t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1  # floor(sigma) + 1
    while True:
        y = _dlaplace_int(t, randbelow)
        gamma = (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        if _bern_exp(gamma, randbelow):
            return y


def _check_sigma2(sigma2) -> Fraction:
    sigma2 = Fraction(sigma2)
    if sigma2 <= 0:
        raise ParameterError(f"the discrete Gaussian's sigma^2 must be > 0, got {sigma2}")
    return sigma2


def secure_dgauss(count: int, sigma2: Fraction) -> np.ndarray:
    """`count` independent N_Z(0, sigma2) samples (int64) from the OS CSPRNG."""
    sigma2 = _check_sigma2(sigma2)
    return np.array([dgauss_one(sigma2) for _ in range(int(count))], dtype=np.int64)


class PrfStream:
    """The uniform integers of one id's keystream AES_key(id || j), j = 0, 1, ... (the layout of
    `noise.prf_noise`'s streams): a server's discrete Gaussian for a node or coordinate is the same
    whenever it is asked for, in any process. `randbelow(m)` takes ceil(bits(m) / 64) words as one
    integer and rejects the top 2^(64 w) mod m values, so it is exactly uniform for any m."""

    _CHUNK = 16  # AES blocks encrypted at a time (32 words)

    def __init__(self, ecb, node_id: int):
        self.ecb, self.id, self.next_block = ecb, int(node_id), 0
        self.words: list[int] = []

    def _word(self) -> int:
        if not self.words:
            inp = np.empty((self._CHUNK, 2), np.uint64)
            inp[:, 0] = self.id
            inp[:, 1] = np.arange(self.next_block, self.next_block + self._CHUNK, dtype=np.uint64)
            self.next_block += self._CHUNK
            self.words = np.frombuffer(self.ecb.encrypt(inp.astype("<u8").tobytes()), "<u8").tolist()[::-1]
        return self.words.pop()

    def randbelow(self, m: int) -> int:
        w = -(-m.bit_length() // 64)
        top = 1 << (64 * w)
        limit = top - top % m
        while True:
            v = 0
            for _ in range(w):
                v = (v << 64) | self._word()
            if v < limit:
                return v % m


def prf_dgauss(key: bytes, ids: np.ndarray, sigma2: Fraction) -> np.ndarray:
    """N_Z(0, sigma2) for each id (uint64), each from its own keystream under the AES key `key`
    (`PrfStream`): the same id always gives the same sample, different ids independent ones."""
    from Crypto.Cipher import AES

    sigma2 = _check_sigma2(sigma2)
    ecb = AES.new(key, AES.MODE_ECB)
    ids = np.asarray(ids, np.uint64).reshape(-1)
    return np.array([dgauss_one(sigma2, PrfStream(ecb, int(i)).randbelow) for i in ids], dtype=np.int64)


_WIDE = 50.0  # sigma^2 above this: the discrete sums equal their Gaussian integrals in float64


def dgauss_pmf(sigma2: float, support: np.ndarray) -> np.ndarray:
    """The exact probabilities of N_Z(0, sigma2) at `support`: normalised over |y| <= 40 sigma + 40, or,
    for sigma^2 > 50, by sqrt(2 pi sigma^2) (Poisson summation: the sum differs from it by a relative
    2 exp(-2 pi^2 sigma^2) < 10^-400, and summing would take memory in proportion to sigma)."""
    ys = np.asarray(support, np.float64)
    if sigma2 > _WIDE:
        return np.exp(-ys**2 / (2 * sigma2)) / math.sqrt(2 * math.pi * sigma2)
    m = int(40 * math.sqrt(sigma2)) + 40
    grid = np.arange(-m, m + 1, dtype=np.float64)
    return np.exp(-ys**2 / (2 * sigma2)) / np.exp(-grid**2 / (2 * sigma2)).sum()


def dgauss_variance(sigma2: float) -> float:
    """Var of N_Z(0, sigma2) (at most sigma2; CKS 2020, Corollary 9): summed for sigma^2 <= 50, else
    sigma^2 itself (the gap is below sigma^2 * 8 pi^2 sigma^2 exp(-2 pi^2 sigma^2), far under float64's
    resolution; the factorization's sigma^2 is ~10^10 / rho)."""
    if sigma2 > _WIDE:
        return float(sigma2)
    m = int(40 * math.sqrt(sigma2)) + 40
    ys = np.arange(-m, m + 1, dtype=np.float64)
    w = np.exp(-ys**2 / (2 * sigma2))
    return float((ys**2 * w).sum() / w.sum())


def check_rho(rho: object) -> float:
    """rho as a float in [1e-9, 1e6]; ParameterError for anything else (also an int too large for a float)."""
    try:
        ok = not isinstance(rho, bool) and isinstance(rho, (int, float)) and math.isfinite(rho) and 0 < rho <= 1e6
    except OverflowError:
        ok = False
    if not ok or not isinstance(rho, (int, float)):
        raise ParameterError(f"rho must be a finite number in (0, 1e6], got {rho!r:.60}")
    if rho < 1e-9:
        raise ParameterError(f"rho must be at least 1e-9, got {rho!r}")
    return float(rho)


def zcdp_to_dp(rho: float, delta: float) -> float:
    """The epsilon of (epsilon, delta)-DP that rho-zCDP implies: rho + 2 sqrt(rho log(1/delta))
    (Bun and Steinke 2016, Proposition 1.3)."""
    if not 0 < delta < 1:
        raise ParameterError(f"delta must lie in (0, 1), got {delta!r}")
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def gaussian_tree(size: int, rho: float, relation: str = "substitution", branching: int = 2) -> "GaussianTreeMechanism":
    """The rho-zCDP discrete Gaussian tree for a grid of `size` points (see `GaussianTreeMechanism`)."""
    return GaussianTreeMechanism(size=size, epsilon=1.0, relation=relation, branching=branching, rho=rho)


class GaussianVariance(Fraction):
    """A node noise 'scale' that asks the noise function for N_Z(0, sigma^2) instead of DLap."""


def calibrate_sigma2(delta2: int | Fraction, rho: float) -> GaussianVariance:
    """sigma^2 = Delta2 / (2 rho) for a release of L2 squared sensitivity Delta2 at rho-zCDP (CKS 2020,
    Theorem 14), rounded *up* to a rational of denominator <= 2^20, so the exact guarantee
    Delta2 / (2 sigma^2) is at most rho (and within a relative 2^-20 of it)."""
    want = Fraction(delta2) / (2 * Fraction(rho))
    s2 = want.limit_denominator(_MAX_DEN)
    if s2 < want:
        s2 = Fraction(math.ceil(want * _MAX_DEN), _MAX_DEN)
    return GaussianVariance(s2)


class ZcdpAccounting:
    """The guarantee of a discrete Gaussian mechanism, stated in rho and in (epsilon, delta): what
    the zCDP mechanisms share. A subclass gives `exact_rho(relation)` (a Fraction, or None when the
    release gives no guarantee under that relation) and `_describe()`."""

    rho: float
    relation: str

    def exact_rho(self, relation: str) -> Fraction | None:
        raise NotImplementedError

    def rho_for(self, relation: str) -> float:
        exact = self.exact_rho(relation)
        return math.inf if exact is None else float(exact)

    def epsilon_for(self, relation: str, delta: float = 1e-6) -> float:
        """The (epsilon, delta)-DP guarantee under `relation` (inf if none)."""
        rho = self.rho_for(relation)
        return math.inf if math.isinf(rho) else zcdp_to_dp(rho, delta)

    def exact_epsilon(self, relation: str):  # pure epsilon-DP: none (only approximate DP)
        return None

    def rounded_budgets(self) -> int:
        return 1

    def statement(self, relation: str | None = None) -> str:
        relation = check_relation(self.relation if relation is None else relation)
        rho = self.exact_rho(relation)
        if rho is None:
            return f"no DP guarantee under {relation} ({self._no_guarantee()}; {self._describe()})"
        return (f"{float(rho):.6g}-zCDP under {relation} (exact rational accounting <= rho = {self.rho:g}; implies "
                f"({zcdp_to_dp(float(rho), 1e-6):.4g}, 1e-6)-DP; {self._describe()})")

    def stated_epsilon(self, relation: str | None = None) -> float:
        return self.epsilon_for(self.relation if relation is None else relation)

    def _describe(self) -> str:
        raise NotImplementedError

    if TYPE_CHECKING:  # the mechanism's (`Mechanism._no_guarantee`), or the subclass's own
        def _no_guarantee(self) -> str: ...


@dataclass
class GaussianTreeMechanism(ZcdpAccounting, TreeMechanism):
    """A b-ary tree (default b = 2) with discrete Gaussian node noise N_Z(0, sigma^2), the same
    sigma^2 at every noised level, the consistent (GLS) estimate and the monotone fit afterwards.

    Privacy: rho-zCDP under `relation`. Per level, a neighbour changes the node counts by an L2
    squared norm of at most Delta2 = 2 (substitution: one unit leaves one node and joins another) or
    1 (add/remove: one node of every level, the root included since n is not public); the discrete
    Gaussian gives Delta2 / (2 sigma^2)-zCDP per level (CKS 2020, Theorem 4) and levels compose, so
    rho_total = H Delta2 / (2 sigma^2) over the H noised levels; sigma^2 = H Delta2 / (2 rho), rounded
    *up* to a rational of denominator <= 2^20, so the exact guarantee is at most rho. It implies
    (epsilon, delta)-DP with epsilon = rho + 2 sqrt(rho log(1/delta)) for every delta in (0, 1)
    (`epsilon_for(relation, delta)`). A tree calibrated for substitution gives no add/remove
    guarantee (its root, n, is exact). Expected squared error per prefix of the covering estimator:
    sum_l n_l Var(N_Z(0, sigma^2)) / N.
    """

    rho: float = 0.0
    sigma2: GaussianVariance = field(init=False)

    name = "gaussian-tree"

    def __post_init__(self) -> None:
        self.rho = check_rho(self.rho)
        check_relation(self.relation)
        self.branching = 2 if self.branching is None else int(self.branching)
        if self.branching < 2:
            raise ParameterError(f"branching must be >= 2, got {self.branching}")
        self.shape = TreeShape.for_size(self.size, self.branching)
        noised = self.noised_levels()
        self.budgets = tuple(self.rho / len(noised) for _ in noised)
        delta2 = self.level_sensitivity(self.relation)  # 2 or 1 is also the L2 squared norm per level
        self.sigma2 = calibrate_sigma2(len(noised) * delta2, self.rho)
        self.scales = [None] * (self.shape.height + 1)
        for level in noised:
            self.scales[level] = self.sigma2
        self.epsilon = zcdp_to_dp(self.rho, 1e-6)  # informative only: the guarantee is stated in rho

    def _root_noised(self) -> bool:
        """The root is noised under add/remove when a covering uses it (a full tree): every level has
        the same sigma^2 here, so a root level would cost as much as any other."""
        return self.relation == "add-remove" and self.size == self.shape.branching**self.shape.height

    def exact_rho(self, relation: str) -> Fraction | None:
        """H Delta2 / (2 sigma^2) exactly; None for add/remove on a substitution-calibrated tree."""
        if check_relation(relation) == "add-remove" and self.relation == "substitution":
            return None
        return Fraction(len(self.noised_levels()) * self.level_sensitivity(relation)) / (2 * Fraction(self.sigma2))

    def variances(self) -> np.ndarray:
        v = dgauss_variance(float(self.sigma2))
        return np.array([0.0 if s is None else v for s in self.scales])

    def _describe(self) -> str:
        return (f"discrete Gaussian tree, branching {self.branching}, height {self.shape.height}, "
                f"node noise N_Z(0, {float(self.sigma2):.4g}) at each of {len(self.noised_levels())} levels")
