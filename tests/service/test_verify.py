"""The report check of docs/verification.md (dpcdf.service.verify): honest reports always pass, every
malformed class from issue 12 fails, a lying (a, A) pair gains nothing, and over small primes an
exact count of the challenges shows that no malformed vector passes with probability above 2/p."""
from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcdf.service import verify as V
from fss import field as F

P = F.P
KEY = hashlib.sha256(b"test verification key").digest()


def _bytes(label: str, n: int) -> bytes:
    out, i = b"", 0
    while len(out) < n:
        out += hashlib.sha256(f"{label}/{i}".encode()).digest()
        i += 1
    return out[:n]


def _step(n_grid: int, alpha: int, beta: int = 1) -> list[int]:
    """The DCF(cmp="ge") values at the grid points: beta where i >= alpha."""
    return [beta % P if i >= alpha else 0 for i in range(n_grid)]


def _run(ys: list, payload: str = "count", label: str = "run", pairs=None, context: bytes = b"task/frozen-hash"):
    """Shares the reconstructed grid values `ys` (n lists of N ints, or of N pairs for labels),
    runs both servers, returns (accepted, e, V0, V1, r, s, pairs)."""
    y = F.from_ints(np.array(ys, dtype=object))
    y0, y1 = V.share(y, _bytes(label + "/shares", 16 * y.size))
    pairs = pairs or V.client_pairs(len(ys), _bytes(label + "/pairs", 48 * len(ys)))
    width = 1 if payload == "count" else 2
    r, s = V.challenges(KEY, context, y.shape[1] * width)
    ok, e, (v0, v1) = V.verify(y0, y1, *pairs, r, s, payload)
    return ok, e, v0, v1, r, s, pairs


def _full_vector(y: list[int]) -> list[int]:
    """(D_0 .. D_{N-1}, top) of a count report, over the integers mod P."""
    d = [(y[i] - (y[i - 1] if i else 0)) % P for i in range(len(y))]
    return d + [(1 - y[-1]) % P]


# --- completeness ----------------------------------------------------------------------------------
@settings(max_examples=60)
@given(n_grid=st.integers(1, 48), data=st.data(), seed=st.binary(min_size=8, max_size=8))
def test_honest_count_reports_always_pass(n_grid, data, seed):
    alphas = data.draw(st.lists(st.integers(0, n_grid - 1), min_size=1, max_size=6))
    ok, e, v0, v1, *_ = _run([_step(n_grid, a) for a in alphas], label=seed.hex())
    assert ok.all()
    assert (F.add(v0, v1) == 0).all() and (v0 == F.neg(v1)).all()  # each server's V_b is minus the other's


@settings(max_examples=40)
@given(n_grid=st.integers(1, 32), data=st.data(), seed=st.binary(min_size=8, max_size=8))
def test_honest_label_reports_always_pass(n_grid, data, seed):
    rows = data.draw(st.lists(st.tuples(st.integers(0, n_grid - 1), st.integers(0, 1)), min_size=1, max_size=6))
    ys = [list(zip(_step(n_grid, a, lab), _step(n_grid, a, 1 - lab))) for a, lab in rows]
    ok, *_ = _run(ys, payload="label", label=seed.hex())
    assert ok.all()


def test_opened_e_is_z_minus_a_and_looks_uniform():
    """What each server sees of an honest report besides its own shares: e = z - a (a uniform and
    secret, so e is uniform whatever alpha is) and V = 0."""
    n_grid, n = 16, 4000
    ys = [_step(n_grid, 3)] * n  # every report the same value: e must still be spread over F_p
    ok, e, v0, v1, r, s, pairs = _run(ys, label="uniform-e")
    assert ok.all()
    a = F.add(pairs[0][0], pairs[1][0])
    assert (F.add(e, a) == r[3]).all()  # z = r_alpha for the unit vector e_alpha
    top_bits = (e >> np.uint64(58)).astype(int)  # 3 top bits of 61: 8 nearly equal bins under uniformity
    counts = np.bincount(top_bits, minlength=8)
    assert counts.min() > n / 8 * 0.8 and counts.max() < n / 8 * 1.2
    assert len(np.unique(e)) == n


# --- soundness on the real field ---------------------------------------------------------------
N_GRID = 12
H = (P + 1) // 2  # 1/2 in F_p
MALFORMED = {
    "payload 0": [0] * N_GRID,
    "payload 2": _step(N_GRID, 4, 2),
    "payload 10^6": _step(N_GRID, 4, 10**6),
    "payload -1": _step(N_GRID, 4, -1),
    "payload -10^6": _step(N_GRID, 0, -(10**6)),
    "payload 1/2": _step(N_GRID, 4, H),
    "two steps": [a + b for a, b in zip(_step(N_GRID, 2), _step(N_GRID, 7))],
    "up then down (weight 1 at two points)": [1 if 3 <= i < 6 else 0 for i in range(N_GRID)],
    "step of 1 with a -1 and +1 elsewhere": [(a - b + c) for a, b, c in zip(_step(N_GRID, 1), _step(N_GRID, 5), _step(N_GRID, 9))],
    "step outside the grid (alpha >= N)": _step(N_GRID + 4, N_GRID + 2)[:N_GRID],
    "step of 2 then -1 (ends at 1)": [a + b for a, b in zip(_step(N_GRID, 2, 2), _step(N_GRID, 8, -1))],
    "one value off": [v + (5 if i == 9 else 0) for i, v in enumerate(_step(N_GRID, 4))],
    "ends at 1 only at the top": [0] * (N_GRID - 1) + [2],
    "half steps": [a + b for a, b in zip(_step(N_GRID, 2, H), _step(N_GRID, 6, H))],
}


def _random_vectors(k: int) -> list[list[int]]:
    rng = np.random.default_rng(12)  # the malformed inputs only
    return [[int(v) for v in rng.integers(0, 1 << 61, N_GRID) % P] for _ in range(k)]


@pytest.mark.parametrize("context", [b"close-1", b"close-2", b"close-3"])
def test_every_malformed_class_fails(context):
    names = list(MALFORMED) + [f"random {i}" for i in range(40)]
    ys = list(MALFORMED.values()) + _random_vectors(40)
    ok, *_ = _run(ys, label="malformed/" + context.decode(), context=context)
    assert not ok.any(), [n for n, accepted in zip(names, ok) if accepted]


def test_malformed_label_reports_fail():
    n = N_GRID
    cases = {
        "label 2, 1 - label = -1": list(zip(_step(n, 3, 2), _step(n, 3, -1))),
        "both components 1": list(zip(_step(n, 3), _step(n, 3))),
        "both components 0": list(zip([0] * n, [0] * n)),
        "halves": list(zip(_step(n, 3, H), _step(n, 3, H))),
        "label and 1 - label at different alphas (two units)": list(zip(_step(n, 3), _step(n, 5))),
        "one curve steps up and down, the other up (sum 1)": list(zip([a - b for a, b in zip(_step(n, 3), _step(n, 5))], _step(n, 5))),
        "unit label plus a spurious -1/+1": list(zip([a - b + c for a, b, c in zip(_step(n, 1), _step(n, 4), _step(n, 6))], [0] * n)),
        "step outside the grid": list(zip([0] * n, [0] * n)),
    }
    ok, *_ = _run(list(cases.values()), payload="label", label="label-malformed")
    assert not ok.any(), [k for k, a in zip(cases, ok) if a]


def test_protocol_opens_exactly_the_check_polynomial():
    """V_0 + V_1 = (sum r_i D_i)^2 - sum r_i^2 D_i + s * top + (A - a^2), for honest and lying pairs,
    so the exhaustive counts below (on `check_value`) are counts of the protocol's own acceptance."""
    ys = list(MALFORMED.values())[:6] + [_step(N_GRID, 5)]
    n = len(ys)
    (a0, big0), (a1, big1) = V.client_pairs(n, _bytes("lying", 48 * n))
    deltas = F.from_ints([0, 1, 7, -3, 10**6, 0, 5])
    lying = ((a0, F.add(big0, deltas)), (a1, big1))
    ok, e, v0, v1, r, s, _ = _run(ys, label="poly", pairs=lying)
    for k, y in enumerate(ys):
        want = V.check_value(_full_vector(y), [int(x) for x in r], int(s), int(deltas[k]))
        assert int(F.add(v0[k], v1[k])) == want
    assert not ok[-1]  # an honest vector with a lying pair (delta = 5) is rejected: the client's own loss


def test_lying_pair_helps_only_with_known_challenges():
    """A client who knew (r, s) could pick delta = -(Q(r) + s*top) and pass a malformed report; with
    challenges drawn after the upload from the servers' key it cannot."""
    y = MALFORMED["payload 10^6"]
    guessed_r, guessed_s = V.challenges(b"the client's guess of the key", b"task/frozen-hash", N_GRID)
    delta = (-V.check_value(_full_vector(y), [int(x) for x in guessed_r], int(guessed_s))) % P
    (a0, big0), (a1, big1) = V.client_pairs(1, _bytes("cancel", 48))
    lying = ((a0, F.add(big0, F.from_ints([delta]))), (a1, big1))
    ok, *_ = _run([y], label="cancel", pairs=lying)
    assert not ok[0]
    y_sh = V.share(F.from_ints(np.array([y], dtype=object)), _bytes("cancel/sh", 16 * N_GRID))
    ok_if_known, _, _ = V.verify(*y_sh, *lying, guessed_r, guessed_s)
    assert ok_if_known[0]  # why r must stay unpredictable to the client


def test_the_same_check_over_z_2_64_is_unsound():
    """The issue's counterexample: over Z_{2^64}, d = e_j + 2^63 e_k + 2^63 e_l (sum 1) passes whenever
    r_k + r_l is even, about half the time; over F_p it never passed above."""
    m = 1 << 64
    rng = np.random.default_rng(3)  # the challenges of this demonstration only
    d = [0] * 6
    d[1], d[3], d[4] = 1, 1 << 63, 1 << 63
    passes = 0
    for _ in range(2000):
        r = [int(x) for x in rng.integers(0, 1 << 63, 6, dtype=np.int64)]
        z = sum(ri * di for ri, di in zip(r, d)) % m
        passes += (z * z - sum(ri * ri * di for ri, di in zip(r, d))) % m == 0
    assert 0.45 < passes / 2000 < 0.55


# --- soundness by exact enumeration over small primes ------------------------------------------
def _pass_counts_all_challenges(vectors: np.ndarray, p: int) -> np.ndarray:
    """For each vector (D_0 .. D_{M-1}, top) the number of challenges (r_0 .. r_{M-1}, s) in F_p^(M+1)
    with check value 0, by enumerating every challenge."""
    m = vectors.shape[1] - 1
    grid = np.array(list(itertools.product(range(p), repeat=m + 1)), dtype=np.int64)  # (p^(M+1), M+1)
    r, s = grid[:, :m], grid[:, m]
    counts = []
    for vec in vectors:
        vals = V.check_value(np.broadcast_to(vec, (grid.shape[0], m + 1)), r, s, 0, p)
        counts.append(int(np.count_nonzero(vals == 0)))
    return np.array(counts)


def _count_vectors(n_grid: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Every y in F_p^N as (D, top) vectors, and which of them are honest (D = e_alpha, top = 0)."""
    ys = np.array(list(itertools.product(range(p), repeat=n_grid)), dtype=np.int64)
    prev = np.concatenate([np.zeros((len(ys), 1), np.int64), ys[:, :-1]], axis=1)
    vecs = np.concatenate([(ys - prev) % p, ((1 - ys[:, -1]) % p)[:, None]], axis=1)
    honest = np.array([any((ys[k] == np.array(_step(n_grid, a))).all() for a in range(n_grid)) for k in range(len(ys))])
    return vecs, honest


def test_exhaustive_small_prime_count_reports():
    """p = 31, N = 2: all 961 grid vectors, all 29,791 challenges each."""
    p = 31
    vecs, honest = _count_vectors(2, p)
    counts = _pass_counts_all_challenges(vecs, p)
    total = p**3
    assert honest.sum() == 2 and (counts[honest] == total).all()
    worst = counts[~honest].max()
    assert worst <= 2 * total // p, worst
    # measured: for N = 2 the worst malformed vector passes with probability exactly 1/p (its Q(r) is
    # a multiple of a square, or top != 0 fixes s); 2/p is the bound for any N
    assert worst == total // p


def test_exhaustive_small_prime_label_reports():
    """p = 31, label task with N = 1: every (y^(0), y^(1)) in F_p^2, every (r_0, r_1, s)."""
    p = 31
    pairs = np.array(list(itertools.product(range(p), repeat=2)), dtype=np.int64)
    vecs = np.concatenate([pairs, ((1 - pairs[:, 0] - pairs[:, 1]) % p)[:, None]], axis=1)
    honest = (pairs == [1, 0]).all(axis=1) | (pairs == [0, 1]).all(axis=1)
    counts = _pass_counts_all_challenges(vecs, p)
    assert honest.sum() == 2 and (counts[honest] == p**3).all()
    assert counts[~honest].max() <= 2 * p**2
    assert counts[~honest].max() == p**2  # measured: 1/p at most here too


def test_exhaustive_p101_every_vector_every_r():
    """p = 101, N = 2: all 10,201 grid vectors against all 10,201 r in F_p^2; s is counted exactly
    (for fixed r, V = Q(r) + s*top is 0 for exactly one s if top != 0, for all p or none if top = 0)."""
    p = 101
    vecs, honest = _count_vectors(2, p)
    r = np.array(list(itertools.product(range(p), repeat=2)), dtype=np.int64)
    worst = 0
    for vec, good in zip(vecs, honest):
        q = V.check_value(np.broadcast_to(np.append(vec[:2], 0), (len(r), 3)), r, 0, 0, p)  # Q(r): top 0, s 0
        passes = len(r) if vec[2] else p * int(np.count_nonzero(q == 0))
        if good:
            assert passes == p**3
        else:
            worst = max(worst, passes)
    assert worst <= 2 * p**2, worst / p**3
    assert worst == p**2  # measured: exactly 1/p for N = 2


def test_exhaustive_lying_pairs():
    """p = 31, N = 1, every y, every client error delta = A - a^2, every (r_0, s): accepted with
    probability 1 only for the honest y with delta = 0, else at most 2/p."""
    p = 31
    grid = np.array(list(itertools.product(range(p), repeat=2)), dtype=np.int64)
    for y in range(p):
        vec = np.broadcast_to([y, (1 - y) % p], (len(grid), 2))
        for delta in range(p):
            passes = int(np.count_nonzero(V.check_value(vec, grid[:, :1], grid[:, 1], delta, p) == 0))
            if y == 1 and delta == 0:
                assert passes == p * p
            else:
                assert passes <= 2 * p, (y, delta, passes)


def test_challenges_are_deterministic_and_bound_to_key_and_context():
    r1, s1 = V.challenges(KEY, b"ctx", 5)
    r2, s2 = V.challenges(KEY, b"ctx", 5)
    assert (r1 == r2).all() and s1 == s2 and (r1 < P).all()
    r3, _ = V.challenges(KEY, b"ctx2", 5)
    r4, _ = V.challenges(hashlib.sha256(b"other").digest(), b"ctx", 5)
    assert not (r1 == r3).any() and not (r1 == r4).any()
    with pytest.raises(ValueError, match="16 bytes"):
        V.challenges(b"short", b"ctx", 5)


def test_the_2_over_p_bound_is_nearly_attained():
    """y = (1, 2, 1): D = e_0 + e_1 - e_2, top = 0, Q(r) = 2 (r_0 - r_2)(r_1 - r_2): zero on two planes,
    so it passes with probability exactly (2p - 1)/p^2 (p = 101, every r in F_p^3 enumerated)."""
    p = 101
    r = np.array(list(itertools.product(range(p), repeat=3)), dtype=np.int64)
    vec = np.broadcast_to([1, 1, p - 1, 0], (len(r), 4))
    zeros = int(np.count_nonzero(V.check_value(vec, r, 0, 0, p) == 0))
    assert zeros == 2 * p * p - p  # times p values of s (top = 0): probability (2p - 1)/p^2 < 2/p


def test_real_prime_field_keys_honest_and_tampered():
    """End to end with fss keys over F_p (DCF(cmp="ge", group="p61")): whatever the key pair (honest,
    wrong payload, alpha off the grid, a flipped control-bit correction, a replaced payload
    correction or a changed root seed in one party's key, keys of two different pairs), the servers'
    grid evaluations reconstruct some y, and the check accepts exactly when y is an honest step on
    the grid."""
    from fss import DCF
    from fss import reference as R

    bits, n_grid = 6, 40
    fn = DCF(bits, cmp="ge", group="p61")
    p = fn.params
    rng = np.random.default_rng(5)  # which tampering, not key randomness
    pairs, kinds = [], []

    def add(k0, k1, kind):
        pairs.append((k0.to_bytes(), k1.to_bytes()))
        kinds.append(kind)

    for alpha in (0, 7, 39):
        add(*fn.gen(alpha), "honest")
    for beta in (0, 2, 10**6, -1, -(10**6)):
        add(*fn.gen(11, beta), "payload")
    for alpha in (40, 63):
        add(*fn.gen(alpha), "off the grid")
    for trial in range(24):
        k0, k1 = fn.gen(int(rng.integers(0, n_grid)))
        ref = R.decode(p, k1.to_bytes())
        level = int(rng.integers(0, bits))
        if trial % 3 == 0:
            tl, tr = ref.cw_t[level]
            ref.cw_t[level] = (tl ^ 1, tr) if trial % 2 else (tl, tr ^ 1)
        elif trial % 3 == 1:
            ref.cw_v[level] = [int(rng.integers(0, 1 << 61)) % P]
        else:
            ref.seed ^= 1 << int(rng.integers(1, 128))
        add(k0, fn.key_from_bytes(R.encode(p, ref)), "tampered")
    for _ in range(4):
        add(fn.gen(int(rng.integers(0, n_grid)))[0], fn.gen(int(rng.integers(0, n_grid)))[1], "two pairs")

    n = len(pairs)
    b0 = fn.batch_from_keys([a for a, _ in pairs], 0)
    b1 = fn.batch_from_keys([b for _, b in pairs], 1)
    idx, xs = np.repeat(np.arange(n), n_grid), np.tile(np.arange(n_grid), n)
    y0 = fn.eval_batch(b0.select(idx), xs).reshape(n, n_grid)
    y1 = fn.eval_batch(b1.select(idx), xs).reshape(n, n_grid)
    y = F.add(y0, y1)
    steps = np.array([[1 if i >= a else 0 for i in range(n_grid)] for a in range(n_grid)], np.uint64)
    honest = np.array([(steps == row).all(axis=1).any() for row in y])
    r, s = V.challenges(KEY, b"end-to-end", n_grid)
    ok, _, _ = V.verify(y0, y1, *V.client_pairs(n), r, s)
    np.testing.assert_array_equal(ok, honest)
    kinds = np.array(kinds)
    assert honest[kinds == "honest"].all() and not honest[np.isin(kinds, ["payload", "off the grid", "two pairs"])].any()
    # a tampered correction that no grid point's path uses leaves y honest (and the check then rightly
    # accepts); most tampering breaks y, so the comparison above is not vacuous
    assert (~honest[kinds == "tampered"]).sum() >= 12
