"""The report check of docs/verification.md (dpcdf.service.verification.maths): honest reports always pass, every
malformed class from issue 12 fails, a lying (a, A) pair gains nothing, and over small primes an
exact count of the challenges shows that no malformed vector passes with probability above 2/p.
The same for `Check`, the service's two-round interface, with all three payloads (count, label,
calibration (1, label, q)): reason classes, lying pairs, triples and bits, exhaustive small-prime
counts of the three calibration sub-checks, uniformity of what the servers see."""
from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcdf.errors import ParameterError
from dpcdf.service.verification import maths as V, randomness as RND, reference as REF
from fss import field as F

P = F.P
KEY = hashlib.sha256(b"test verification key").digest()


def _bytes(label: str, n: int) -> bytes:
    """n bytes that depend only on `label`: SHA-256 of "label/0", "label/1", ... joined (once: adding
    to a bytes object block by block copied it each time, 20 s of the suite for the 10^5-report test)."""
    return b"".join(hashlib.sha256(f"{label}/{i}".encode()).digest() for i in range(-(-n // 32)))[:n]


def _step(n_grid: int, alpha: int, beta: int = 1) -> list[int]:
    """The DCF(cmp="ge") values at the grid points: beta where i >= alpha."""
    return [beta % P if i >= alpha else 0 for i in range(n_grid)]


def _run(ys: list, payload: str = "count", label: str = "run", pairs=None, context: bytes = b"task/frozen-hash"):
    """Shares the reconstructed grid values `ys` (n lists of N ints, or of N pairs for labels),
    runs both servers, returns (accepted, e, V0, V1, r, s, pairs)."""
    y = F.from_ints(np.array(ys, dtype=object))
    y0, y1 = RND.share(y, _bytes(label + "/shares", 16 * y.size))
    pairs = pairs or RND.client_pairs(len(ys), _bytes(label + "/pairs", 48 * len(ys)))
    width = 1 if payload == "count" else 2
    r, s = RND.challenges(KEY, context, y.shape[1] * width)
    ok, e, (v0, v1) = REF.verify(y0, y1, *pairs, r, s, payload)
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
    (a0, big0), (a1, big1) = RND.client_pairs(n, _bytes("lying", 48 * n))
    deltas = F.from_ints([0, 1, 7, -3, 10**6, 0, 5])
    lying = ((a0, F.add(big0, deltas)), (a1, big1))
    ok, e, v0, v1, r, s, _ = _run(ys, label="poly", pairs=lying)
    for k, y in enumerate(ys):
        want = REF.check_value(_full_vector(y), [int(x) for x in r], int(s), int(deltas[k]))
        assert int(F.add(v0[k], v1[k])) == want
    assert not ok[-1]  # an honest vector with a lying pair (delta = 5) is rejected: the client's own loss


def test_lying_pair_helps_only_with_known_challenges():
    """A client who knew (r, s) could pick delta = -(Q(r) + s*top) and pass a malformed report; with
    challenges drawn after the upload from the servers' key it cannot."""
    y = MALFORMED["payload 10^6"]
    guessed_r, guessed_s = RND.challenges(b"the client's guess of the key", b"task/frozen-hash", N_GRID)
    delta = (-REF.check_value(_full_vector(y), [int(x) for x in guessed_r], int(guessed_s))) % P
    (a0, big0), (a1, big1) = RND.client_pairs(1, _bytes("cancel", 48))
    lying = ((a0, F.add(big0, F.from_ints([delta]))), (a1, big1))
    ok, *_ = _run([y], label="cancel", pairs=lying)
    assert not ok[0]
    y_sh = RND.share(F.from_ints(np.array([y], dtype=object)), _bytes("cancel/sh", 16 * N_GRID))
    ok_if_known, _, _ = REF.verify(*y_sh, *lying, guessed_r, guessed_s)
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
        vals = REF.check_value(np.broadcast_to(vec, (grid.shape[0], m + 1)), r, s, 0, p)
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
    for at in range(0, len(vecs), 128):  # 128 vectors against every r per call
        chunk, good = vecs[at:at + 128], honest[at:at + 128]
        d = np.concatenate([chunk[:, :2], np.zeros((len(chunk), 1), np.int64)], axis=1)[:, None, :]
        q = REF.check_value(d, r[None, :, :], 0, 0, p)  # Q(r): top 0, s 0; shape (vectors, r)
        passes = np.where(chunk[:, 2] != 0, len(r), p * np.count_nonzero(q == 0, axis=1))
        assert (passes[good] == p**3).all()
        worst = max(worst, int(passes[~good].max(initial=0)))
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
            passes = int(np.count_nonzero(REF.check_value(vec, grid[:, :1], grid[:, 1], delta, p) == 0))
            if y == 1 and delta == 0:
                assert passes == p * p
            else:
                assert passes <= 2 * p, (y, delta, passes)


def test_challenges_are_deterministic_and_bound_to_key_and_context():
    r1, s1 = RND.challenges(KEY, b"ctx", 5)
    r2, s2 = RND.challenges(KEY, b"ctx", 5)
    assert (r1 == r2).all() and s1 == s2 and (r1 < P).all()
    r3, _ = RND.challenges(KEY, b"ctx2", 5)
    r4, _ = RND.challenges(hashlib.sha256(b"other").digest(), b"ctx", 5)
    assert not (r1 == r3).any() and not (r1 == r4).any()
    with pytest.raises(ValueError, match="16 bytes"):
        RND.challenges(b"short", b"ctx", 5)


def test_the_2_over_p_bound_is_nearly_attained():
    """y = (1, 2, 1): D = e_0 + e_1 - e_2, top = 0, Q(r) = 2 (r_0 - r_2)(r_1 - r_2): zero on two planes,
    so it passes with probability exactly (2p - 1)/p^2 (p = 101, every r in F_p^3 enumerated)."""
    p = 101
    r = np.array(list(itertools.product(range(p), repeat=3)), dtype=np.int64)
    vec = np.broadcast_to([1, 1, p - 1, 0], (len(r), 4))
    zeros = int(np.count_nonzero(REF.check_value(vec, r, 0, 0, p) == 0))
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
    r, s = RND.challenges(KEY, b"end-to-end", n_grid)
    ok, _, _ = REF.verify(y0, y1, *RND.client_pairs(n), r, s)
    np.testing.assert_array_equal(ok, honest)
    kinds = np.array(kinds)
    assert honest[kinds == "honest"].all() and not honest[np.isin(kinds, ["payload", "off the grid", "two pairs"])].any()
    # a tampered correction that no grid point's path uses leaves y honest (and the check then rightly
    # accepts); most tampering breaks y, so the comparison above is not vacuous
    assert (~honest[kinds == "tampered"]).sum() >= 12


# --- the service's interface `Check`, all three payloads ------------------------------------------
Q = 1 << 16


def _cal(n_grid: int, alpha: int, label: int, q: int, q_alpha: int | None = None) -> list:
    """A calibration report's grid values (1, label, q) * [i >= alpha] (the score at q_alpha if given)."""
    return list(zip(_step(n_grid, alpha), _step(n_grid, alpha, label), _step(n_grid, alpha if q_alpha is None else q_alpha, q)))


def _grid(ys: list, width: int) -> np.ndarray:
    y = F.from_ints(np.array(ys, dtype=object))
    return y.reshape(y.shape[0], y.shape[1], width) if width > 1 else y


def _check_run(check, ys, betas=None, extras=None, label="check", context=b"task/frozen-hash"):
    """Both servers' sides of `Check` on reconstructed grid values `ys`; returns
    (reasons, opened (n, E), V = V_0 + V_1, challenges, extras x_0 + x_1, (V_0, V_1))."""
    y = _grid(ys, check.width)
    n = y.shape[0]
    y0, y1 = RND.share(y, _bytes(label + "/shares", 16 * y.size))
    if extras is None:
        betas = np.ones((n, 3), np.int64) if betas is None else betas
        size = RND.CALIBRATION_RANDOMNESS if check.payload == "calibration" else 48
        extras = check.client_extras(betas, _bytes(label + "/extras", size * n))
    x0, x1 = extras
    assert x0.shape == x1.shape == (n, check.extras)
    ch = check.challenges(KEY, context)
    m0, st0 = check.round_one(0, y0, x0, ch)
    m1, st1 = check.round_one(1, y1, x1, ch)
    assert m0.shape == m1.shape == (n, check.opened)
    opened = F.add(m0, m1)
    v0, v1 = check.round_two(0, st0, opened, x0), check.round_two(1, st1, opened, x1)
    assert v0.shape == ((n,) if check.check_values == 1 else (n, check.check_values))
    v = F.add(v0, v1)
    return check.verdicts(opened, v), opened, v, ch, F.add(x0, x1), (v0, v1)


def test_check_sizes():
    for payload, (x, e, k) in {"count": (2, 2, 1), "label": (2, 2, 1), "calibration": (56, 21, 3)}.items():
        c = V.Check(payload, 8)
        assert (c.extras, c.opened, c.check_values) == (x, e, k)
    assert RND.BITS == 17 and list(RND.RANGE_WEIGHTS) == [1 << j for j in range(16)] + [1]
    with pytest.raises(ParameterError):
        V.Check("histogram", 8)


Q_VALUES = st.one_of(st.sampled_from([0, 1, Q // 2, Q - 1, Q]), st.integers(0, Q))


@settings(max_examples=30)
@given(n_grid=st.integers(1, 40), data=st.data(), seed=st.binary(min_size=8, max_size=8))
def test_check_honest_reports_always_pass(n_grid, data, seed):
    rows = data.draw(st.lists(st.tuples(st.integers(0, n_grid - 1), st.integers(0, 1), Q_VALUES), min_size=1, max_size=5))
    label = seed.hex()
    reasons, *_ = _check_run(V.Check("count", n_grid), [_step(n_grid, a) for a, _, _ in rows], label=label)
    assert (reasons == V.OK).all()
    ys = [list(zip(_step(n_grid, a, lab), _step(n_grid, a, 1 - lab))) for a, lab, _ in rows]
    reasons, *_ = _check_run(V.Check("label", n_grid), ys, label=label)
    assert (reasons == V.OK).all()
    check = V.Check("calibration", n_grid)
    reasons, opened, v, *_ = _check_run(check, [_cal(n_grid, a, lab, q) for a, lab, q in rows], betas=[(1, lab, q) for _, lab, q in rows], label=label)
    assert (reasons == V.OK).all() and (v == 0).all() and (opened[:, 1] == 0).all()


def test_check_malformed_count_and_label_reasons():
    n = N_GRID
    count = {
        "payload 0": ([0] * n, V.WEIGHT),
        "payload 2": (_step(n, 4, 2), V.WEIGHT),
        "payload 10^6": (_step(n, 4, 10**6), V.WEIGHT),
        "payload -1": (_step(n, 4, -1), V.WEIGHT),
        "step outside the grid": (_step(n + 4, n + 2)[:n], V.WEIGHT),
        "two half steps (sum 1)": ([a + b for a, b in zip(_step(n, 2, H), _step(n, 6, H))], V.SHAPE),
        "step of 2 then -1": ([a + b for a, b in zip(_step(n, 2, 2), _step(n, 8, -1))], V.SHAPE),
        "up, down, up (net 1)": ([a - b + c for a, b, c in zip(_step(n, 1), _step(n, 5), _step(n, 9))], V.SHAPE),
        "two steps of 1 (sum 2)": ([a + b for a, b in zip(_step(n, 2), _step(n, 7))], V.WEIGHT),
        "honest": (_step(n, 5), V.OK),
    }
    reasons, *_ = _check_run(V.Check("count", n), [y for y, _ in count.values()], label="count-reasons")
    assert dict(zip(count, reasons.tolist())) == {k: want for k, (_, want) in count.items()}
    label = {
        "both labels (1, 1)": (list(zip(_step(n, 3), _step(n, 3))), V.WEIGHT),
        "(0, 0)": (list(zip([0] * n, [0] * n)), V.WEIGHT),
        "(2, -1)": (list(zip(_step(n, 3, 2), _step(n, 3, -1))), V.SHAPE),
        "(1/2, 1/2)": (list(zip(_step(n, 3, H), _step(n, 3, H))), V.SHAPE),
        "label and 1 - label at different alphas": (list(zip(_step(n, 3), _step(n, 5))), V.WEIGHT),
        "(1, 0) and (0, 1) at different alphas, ends at (0, 1)": (list(zip([a - b for a, b in zip(_step(n, 3), _step(n, 5))], _step(n, 5))), V.SHAPE),
        "honest": (list(zip(_step(n, 3, 0), _step(n, 3, 1))), V.OK),
    }
    reasons, *_ = _check_run(V.Check("label", n), [y for y, _ in label.values()], label="label-reasons")
    assert dict(zip(label, reasons.tolist())) == {k: want for k, (_, want) in label.items()}


def _claims(q: int) -> list[list[int]]:
    """Bits a client might claim for a score q outside [0, 2^16]: honest-looking bits of a nearby
    value, bits that add up to q but are not all bits, and the largest sum of bits."""
    near = [int(b) for b in RND.range_bits([min(max(q, 0), Q)])[0]]
    not_bits = [0] * RND.BITS
    not_bits[0] = q  # sum_j w_j b_j = q, but b_0 is no bit
    spread = list(near)
    spread[3] += (q - sum(w * b for w, b in zip(RND.RANGE_WEIGHTS.tolist(), near))) * pow(8, -1, P)  # w_3 = 8
    return [near, not_bits, spread, [1] * RND.BITS]


def _calibration_cases(n: int) -> tuple[list, list, list, list, list]:
    """(names, grid values, claimed bits, expected reasons, (pair, triple, bit pair) errors)."""
    cases = []

    def add(name, y, bits, want, errors=(0, 0, 0)):
        cases.append((name, y, bits, want, errors))

    for q in (Q + 1, -1, 1 << 17, H, 10**9):
        for k, bits in enumerate(_claims(q)):
            add(f"q = {q}, claim {k}", _cal(n, 4, 1, q), bits, V.RANGE)
    honest_bits = [int(b) for b in RND.range_bits([300])[0]]
    add("bits of another q (301)", _cal(n, 4, 1, 300), [int(b) for b in RND.range_bits([301])[0]], V.RANGE)
    add("q on another alpha", _cal(n, 4, 1, 300, q_alpha=7), honest_bits, V.SHAPE)
    add("q on another alpha, label 0", _cal(n, 4, 0, 300, q_alpha=2), honest_bits, V.SHAPE)
    add("score split over two alphas", list(zip(_step(n, 4), _step(n, 4), [a + b for a, b in zip(_step(n, 4, 100), _step(n, 8, 200))])), honest_bits, V.SHAPE)
    add("label 2", _cal(n, 4, 2, 300), honest_bits, V.SHAPE)
    add("label -1", _cal(n, 4, -1, 300), honest_bits, V.SHAPE)
    add("label 1/2", _cal(n, 4, H, 300), honest_bits, V.SHAPE)
    add("label on another alpha", list(zip(_step(n, 4), _step(n, 6), _step(n, 4, 300))), honest_bits, V.SHAPE)
    add("first component 0", [(0, 0, 0)] * n, [0] * RND.BITS, V.WEIGHT)
    add("first component 2", list(zip(_step(n, 4, 2), _step(n, 4), _step(n, 4, 300))), honest_bits, V.WEIGHT)
    add("two unit steps", list(zip([a + b for a, b in zip(_step(n, 2), _step(n, 6))], _step(n, 2), _step(n, 2, 300))), honest_bits, V.WEIGHT)
    add("step outside the grid", [(0, 0, 0)] * n, honest_bits, V.WEIGHT)
    add("up, down, up (net 1)", list(zip([a - b + c for a, b, c in zip(_step(n, 1), _step(n, 5), _step(n, 9))], _step(n, 9), _step(n, 9, 300))), honest_bits, V.SHAPE)
    add("lying pair", _cal(n, 4, 1, 300), honest_bits, V.SHAPE, (1, 0, 0))
    add("lying triple", _cal(n, 4, 1, 300), honest_bits, V.SHAPE, (0, P - 5, 0))
    add("lying bit pair", _cal(n, 4, 1, 300), honest_bits, V.RANGE, (0, 0, 3))
    add("lying bit pair cancelling the pair", _cal(n, 4, 1, 300), honest_bits, V.SHAPE, (1, 0, P - 1))
    add("honest", _cal(n, 4, 1, 300), honest_bits, V.OK)
    add("honest q = 2^16 as (1 .. 1, 1)", _cal(n, 4, 0, Q), [1] * RND.BITS, V.OK)
    add("honest q = 1 as b_16 = 1", _cal(n, 4, 0, 1), [0] * 16 + [1], V.OK)
    return [list(col) for col in zip(*cases)]


def _lying_extras(bits, errors, label):
    n = len(bits)
    pair, triple, bit = (F.from_ints([e[k] for e in errors]) for k in range(3))
    bit_errors = np.zeros((n, RND.BITS), np.uint64)
    bit_errors[:, 5] = bit  # the error sits on one bit's pair
    return RND.calibration_extras(np.array(bits, dtype=object), _bytes(label, RND.CALIBRATION_RANDOMNESS * n),
                                pair_error=pair, triple_error=triple, bit_pair_errors=bit_errors)


@pytest.mark.parametrize("context", [b"close-1", b"close-2"])
def test_check_malformed_calibration_reasons(context):
    names, ys, bits, want, errors = _calibration_cases(N_GRID)
    check = V.Check("calibration", N_GRID)
    extras = _lying_extras(bits, errors, "cal-malformed/" + context.decode())
    reasons, *_ = _check_run(check, ys, extras=extras, label="cal-malformed", context=context)
    assert dict(zip(names, reasons.tolist())) == dict(zip(names, want))


def test_check_opens_exactly_the_calibration_polynomial():
    """(V1, V2, V3) opened by `Check` equal `calibration_check_values` of the reconstructed report,
    bits and client errors, so the exhaustive small-prime counts below count the protocol's own
    acceptance."""
    names, ys, bits, _, errors = _calibration_cases(N_GRID)
    check = V.Check("calibration", N_GRID)
    extras = _lying_extras(bits, errors, "cal-poly")
    _, opened, v, ch, x, _ = _check_run(check, ys, extras=extras, label="cal-poly")
    y = _grid(ys, 3)
    args = ([int(t) for t in ch.r], int(ch.s), [int(t) for t in ch.rho], int(ch.sigma), [[int(t) for t in row] for row in ch.rbits])
    for k in range(len(ys)):
        want = REF.calibration_check_values(y[k].astype(object), [int(b) for b in x[k, RND.X_BITS]], *args, deltas=errors[k])
        assert [int(t) for t in want] == [int(t) for t in v[k]], names[k]
        assert int(opened[k, 1]) == (1 - int(y[k, -1, 0])) % P  # the opened top


def test_lying_range_helps_only_with_known_challenges():
    """q = 2^16 + 1 claimed as b_0 = 2 plus the bits of 2^16 - 1 (adds up to q; b_0 is no bit):
    V3 = (b_0^2 - b_0)(r_00 - r_01)^2 + delta, which a client could cancel with delta if it knew the
    challenges; against the servers' key it fails."""
    n = N_GRID
    bits = [2] + [1] * 15 + [1]
    assert sum(w * b for w, b in zip(RND.RANGE_WEIGHTS.tolist(), bits)) == Q + 1
    check = V.Check("calibration", n)

    def cancelling(key):
        rb = V.CalibrationChallenges.derive(key, b"task/frozen-hash", n).rbits
        t = (int(rb[0, 0]) - int(rb[0, 1])) % P
        errors = np.zeros((1, RND.BITS), np.uint64)
        errors[0, 0] = (-2 * t * t) % P
        return RND.calibration_extras([bits], _bytes("cancel-range", RND.CALIBRATION_RANDOMNESS), bit_pair_errors=errors)

    ys = [_cal(n, 4, 1, Q + 1)]
    reasons, *_ = _check_run(check, ys, extras=cancelling(b"the client's guess of the key....."), label="cancel-range")
    assert reasons.tolist() == [V.RANGE]
    reasons, *_ = _check_run(check, ys, extras=cancelling(KEY), label="cancel-range")
    assert reasons.tolist() == [V.OK]  # why the challenges must stay unpredictable to the client


def test_client_extras_refuses_a_probability_outside_the_range():
    check = V.Check("calibration", 4)
    for q in (-1, Q + 1, 1 << 17, 0.5):
        with pytest.raises(ParameterError, match="integer in"):
            check.client_extras([(1, 0, q)])
    with pytest.raises(ParameterError, match="rows"):
        check.client_extras([(1, 0)])
    x0, x1 = check.client_extras([(1, 1, 0), (1, 0, Q)])
    x = F.add(x0, x1)
    assert x[0, RND.X_BITS].tolist() == [0] * RND.BITS and x[1, RND.X_BITS].tolist() == [1] * RND.BITS
    assert (x[:, 1] == F.mul(x[:, 0], x[:, 0])).all() and (x[:, 4] == F.mul(x[:, 2], x[:, 3])).all()
    assert (x[:, RND.X_BIT_AA] == F.mul(x[:, RND.X_BIT_A], x[:, RND.X_BIT_A])).all()
    q = np.arange(Q + 1)
    assert (F.dot(RND.range_bits(q), RND.RANGE_WEIGHTS[None, :]) == q).all()  # every q has its bits
    assert set(np.unique(RND.range_bits(q)).tolist()) == {0, 1}


def test_calibration_opened_values_look_uniform():
    """4000 honest calibration reports with the same (alpha, label, q): every opened round-one value
    but top (0) is a value minus a fresh uniform client secret, so each of the 20 columns spreads
    evenly over F_p; V = 0 exactly."""
    n_grid, n = 16, 4000
    check = V.Check("calibration", n_grid)
    y = np.broadcast_to(_grid([_cal(n_grid, 3, 1, 777)], 3), (n, n_grid, 3))
    y0, y1 = RND.share(np.ascontiguousarray(y))
    x0, x1 = check.client_extras([(1, 1, 777)] * n)
    ch = check.challenges(KEY, b"uniform")
    m0, st0 = check.round_one(0, y0, x0, ch)
    m1, st1 = check.round_one(1, y1, x1, ch)
    opened = F.add(m0, m1)
    v = F.add(check.round_two(0, st0, opened, x0), check.round_two(1, st1, opened, x1))
    assert (v == 0).all() and (opened[:, 1] == 0).all()
    x = F.add(x0, x1)
    assert (F.add(opened[:, 2], x[:, 2]) == 777).all()  # q - a'
    assert (F.add(opened[:, 3], x[:, 3]) == ch.rho[3]).all()  # sum rho_i D^(0)_i - b' = rho_alpha - b'
    for col in [0] + list(range(2, check.opened)):
        e = opened[:, col]
        counts = np.bincount((e >> np.uint64(58)).astype(int), minlength=8)
        assert counts.min() > n / 8 * 0.8 and counts.max() < n / 8 * 1.2, col
        assert len(np.unique(e)) == n
    low = np.bincount((opened[:, 4:] & np.uint64(7)).astype(int).ravel(), minlength=8)  # low bits, all bit columns
    chi2 = float(((low - low.mean()) ** 2 / low.mean()).sum())
    assert chi2 < 30  # 7 degrees of freedom: p < 1e-4


def test_calibration_end_to_end_with_prime_field_keys():
    """DCF(cmp="ge", width 3, group="p61") keys with payload (1, label, q): the servers' grid
    evaluations go through `Check`; honest payloads pass, the others fail with their reason."""
    from fss import DCF

    bits, n_grid = 6, 40
    fn = DCF(bits, width=3, cmp="ge", group="p61")
    rows = [  # (alpha, payload, claimed q for the bits, reason)
        (0, (1, 1, 0), 0, V.OK), (17, (1, 0, Q), Q, V.OK), (39, (1, 1, 12345), 12345, V.OK),
        (5, (1, 1, Q + 1), Q, V.RANGE), (5, (1, 0, -1), 0, V.RANGE), (9, (1, 2, 7), 7, V.SHAPE),
        (9, (0, 0, 7), 7, V.WEIGHT), (9, (2, 1, 7), 7, V.WEIGHT), (45, (1, 1, 7), 7, V.WEIGHT),
    ]
    k0, k1 = fn.gen_batch(np.array([a for a, *_ in rows]), np.array([list(b) for _, b, *_ in rows], dtype=object))
    n = len(rows)
    idx, xs = np.repeat(np.arange(n), n_grid), np.tile(np.arange(n_grid), n)
    y0 = fn.eval_batch(k0.select(idx), xs).reshape(n, n_grid, 3)
    y1 = fn.eval_batch(k1.select(idx), xs).reshape(n, n_grid, 3)
    check = V.Check("calibration", n_grid)
    x0, x1 = RND.calibration_extras(RND.range_bits([c for *_, c, _ in rows]))
    ch = check.challenges(KEY, b"end-to-end calibration")
    m0, st0 = check.round_one(0, y0, x0, ch)
    m1, st1 = check.round_one(1, y1, x1, ch)
    opened = F.add(m0, m1)
    v = F.add(check.round_two(0, st0, opened, x0), check.round_two(1, st1, opened, x1))
    assert check.verdicts(opened, v).tolist() == [want for *_, want in rows]


# --- calibration: exact enumeration over small primes (on `calibration_check_values`) ------------------
def _all(p: int, k: int) -> np.ndarray:
    return np.array(list(itertools.product(range(p), repeat=k)), dtype=np.int64).reshape(-1, k)


def _cal_values(p, y, bits, r=None, s=0, rho=None, sigma=0, rbits=None, deltas=(0, 0, 0), bound=1):
    """calibration_check_values over F_p with the unused challenges set to 0."""
    y = np.asarray(y)
    n_grid, k = y.shape[-2], len(RND.range_weights(bound))
    r = np.zeros(2 * n_grid, np.int64) if r is None else r
    rho = np.zeros(n_grid, np.int64) if rho is None else rho
    rbits = np.zeros((k, 2), np.int64) if rbits is None else rbits
    return REF.calibration_check_values(y, bits, r, s, rho, sigma, rbits, deltas, bound, p)


def test_exhaustive_calibration_unit_label():
    """p = 19, N = 1: every (y^(0), y^(1)) in F_p^2 (the score irrelevant here), every (r_0, r_1, s):
    V1 vanishes everywhere exactly for (1, label) with label in {0, 1}; every other pair passes with
    probability at most 2/p (measured: exactly 1/p at N = 1)."""
    p = 19
    ch = _all(p, 3)
    ys = _all(p, 2)
    passes = []
    for y0, y1 in ys:
        v1, _, _ = _cal_values(p, np.broadcast_to([[y0, y1, 0]], (len(ch), 1, 3)), [0], r=ch[:, :2], s=ch[:, 2])
        passes.append(int(np.count_nonzero(v1 == 0)))
    passes = np.array(passes)
    honest = (ys[:, 0] == 1) & (ys[:, 1] <= 1)
    assert (passes[honest] == p**3).all()
    assert passes[~honest].max() == p**2  # 1/p <= 2/p


def test_exhaustive_calibration_score():
    """p = 19, N = 2, D^(0) = e_alpha (the unit check passed): every score vector y^(2) in F_p^2, every
    triple error delta, every rho in F_p^2. V2 = sum_i rho_i (D^(2)_i - q D^(0)_i) - delta vanishes
    everywhere exactly when y^(2) is a step of any height q at alpha and delta = 0; otherwise with
    probability exactly 1/p (a nonzero linear polynomial) or 0 (a constant)."""
    p = 19
    rho = _all(p, 2)
    y2s = _all(p, 2)
    for alpha in (0, 1):
        unit = np.array(_step(2, alpha))
        y = np.zeros((len(y2s), 1, 2, 3), np.int64)
        y[:, 0, :, 0] = unit
        y[:, 0, :, 2] = y2s
        honest = (y2s[:, 0] == y2s[:, 1]) if alpha == 0 else (y2s[:, 0] == 0)
        for delta in range(p):
            _, v2, _ = _cal_values(p, y, [0], rho=rho[None, :, :], deltas=(0, delta, 0))
            passes = np.count_nonzero(v2 == 0, axis=1)  # per y^(2), over all rho
            good = honest & (delta == 0)
            assert (passes[good] == p**2).all()
            assert passes[~good].max() <= p, (alpha, delta)
            assert passes[~good & honest].max(initial=0) == 0  # right shape, lying triple: a constant
    assert honest.sum() == p  # one step per height q, for the last alpha


@pytest.mark.parametrize("p, bound", [(5, 1), (11, 1), (5, 2), (5, 3)])
def test_exhaustive_calibration_range(p, bound):
    """Every score q in F_p (the report otherwise honest), every claimed bit vector in F_p^k, every
    error delta of the bit pairs, every (sigma, r_j0, r_j1): V3 vanishes everywhere exactly when the
    bits are bits adding up to q with weights `range_weights(bound)` and delta = 0, so q in
    [0, bound]; every other input passes with probability at most 2/p (attained: a non-bit whose
    (b^2 - b) t^2 + delta = 0 has two roots t)."""
    w = RND.range_weights(bound)
    k = len(w)
    ch = _all(p, 1 + 2 * k)
    sigma, rbits = ch[:, 0], ch[:, 1:].reshape(-1, k, 2)
    worst, honest_inputs = 0, 0
    for q in range(p):
        y = [[[1, 0, q]]]
        for bits in _all(p, k):
            for delta in range(p):
                _, _, v3 = _cal_values(p, y, bits, sigma=sigma, rbits=rbits, deltas=(0, 0, delta), bound=bound)
                passes = int(np.count_nonzero(v3 == 0))
                if (bits <= 1).all() and sum(wj * int(b) for wj, b in zip(w, bits)) == q and delta == 0:
                    assert passes == len(ch)
                    honest_inputs += 1
                else:
                    worst = max(worst, passes)
    assert honest_inputs == 2**k  # every bit vector, for the q it adds up to (all in [0, bound])
    assert worst <= 2 * len(ch) // p
    assert worst == 2 * len(ch) // p if p > 3 else True


def test_exhaustive_calibration_joint():
    """p = 3, N = 1, bound 1 (one bit): every report y in F_p^3, every claimed bit, every client error
    triple (deltas), against every challenge (r_0, r_1, s, rho_0, sigma, r_00, r_01): the report counts
    (V1 = V2 = V3 = 0) for all challenges exactly when it is honest, (1, label, q) with label and q in
    {0, 1}, its bit is q and no error; any other input counts with probability at most 2/p. Each V
    uses its own challenges, so the joint count is the product of the three sub-checks' counts (which
    the larger-prime tests above bound one by one)."""
    p = 3
    ch = _all(p, 7)
    r, s, rho, sigma, rbits = ch[:, :2], ch[:, 2], ch[:, 3:4], ch[:, 4], ch[:, 5:].reshape(-1, 1, 2)
    ys = _all(p, 3).reshape(-1, 1, 1, 3)  # (reports, challenges broadcast, N = 1, 3)
    worst, honest_count = 0, 0
    for deltas in itertools.product(range(p), repeat=3):
        for bit in range(p):
            v1, v2, v3 = _cal_values(p, ys, [bit], r=r, s=s, rho=rho, sigma=sigma, rbits=rbits, deltas=deltas)
            z1, z2, z3 = (np.count_nonzero(v == 0, axis=1) for v in (v1, v2, v3))
            passes = np.count_nonzero((v1 == 0) & (v2 == 0) & (v3 == 0), axis=1)
            assert (passes * len(ch) ** 2 == z1 * z2 * z3).all()
            y = ys[:, 0, 0, :]
            honest = (y[:, 0] == 1) & (y[:, 1] <= 1) & (y[:, 2] == bit) & (bit <= 1) & (deltas == (0, 0, 0))
            assert (passes[honest] == len(ch)).all()
            honest_count += int(honest.sum())
            worst = max(worst, int(passes[~honest].max()))
    assert honest_count == 4
    assert worst <= 2 * len(ch) // p


def test_a_hundred_thousand_honest_reports_all_pass_through_the_servers_code_path():
    """Issue 12: 10^5 honest count reports (real p61 keys from the client's code, a 50-point grid on a
    6-bit domain), checked exactly as the servers do at the close (`round_one.decode_shares`,
    `grid_values`, `Check`): none is excluded, and the histogram shares add up to the exact counts."""
    from dpcdf.service.protocols.check import round_one
    from dpcdf.service.verification import sketch
    from dpcdf.service.task import TaskConfig
    from dpcdf.service.wire import join_share

    grid = {"kind": "thresholds", "values": [float(v) for v in range(50)]}
    config = TaskConfig(grid, 1.0, "path", "substitution", 0, ("a", "b"), ("00" * 32, "01" * 32), "00")
    n, size = 100_000, 50
    alphas = np.frombuffer(_bytes("alphas", 8 * n), np.uint64) % np.uint64(size)
    dcf, check = config.key_dcf(), config.check()  # with the MAC, as the service runs it
    betas, *extras = check.client_report(np.ones((n, 1), np.int64), _bytes("extras", 48 * n))
    keys = dcf.gen_batch(alphas.astype(np.int64), betas)
    ch = check.challenges(KEY, b"close context")
    parts, hist = [], []
    for party in (0, 1):
        # each stored share: the single-key header, the key's body (from one batch encoding), its extras
        head, body = dcf.params.header(party), keys[party].to_bytes()[len(dcf.params.header(party, batch=True)) + 8:]
        rows = np.frombuffer(body, np.uint8).reshape(n, -1)
        shares = [head + rows[i].tobytes() + extras[party][i].astype("<u8").tobytes() for i in range(n)]
        assert shares[7] == join_share(keys[party][7].to_bytes(), extras[party][7])
        batch, x = round_one.decode_shares(dcf, check.extras, shares, party)
        y = round_one.grid_values(dcf, batch, size)
        parts.append((check.round_one(party, y, x, ch), x))
        hist.append(sketch.column_sums(round_one.data(check, y)))
    opened = F.add(parts[0][0][0], parts[1][0][0])
    v = [check.round_two(b, parts[b][0][1], opened, parts[b][1]) for b in (0, 1)]
    ok = V.mac_ok(*(check.mac_values(b, parts[b][0][1], opened, parts[b][1]) for b in (0, 1)))
    assert ok.all() and not check.verdicts(opened, F.add(*v), ok).any()
    counts = F.signed(F.add(hist[0], hist[1]))[:, 0]
    np.testing.assert_array_equal(counts, np.cumsum(np.bincount(alphas.astype(np.int64), minlength=size)))


def test_sorting_takes_storage_order_to_the_sorted_ids():
    """prepare reads shares in storage order and reorders each report's results by its id (bytewise,
    as SQLite's ORDER BY report_id): ids with trailing or leading zero bytes and 0xff included; an
    unknown, repeated or missing id is a SyncError, never a report at another's position."""
    import random
    import secrets

    from dpcdf.service.protocols.reconciliation.maths import SyncError
    from dpcdf.service.protocols.check.round_one import sorting

    ids = sorted({secrets.token_bytes(16) for _ in range(200)} | {bytes(16), bytes(15) + b"\x01", b"\x01" + bytes(15),
                                                                   b"\xff" * 16, b"\xff" * 15 + b"\x00"})
    stored = ids[:]
    random.Random(3).shuffle(stored)
    rows = lambda ids: np.frombuffer(b"".join(ids), np.uint8).reshape(len(ids), -1)  # noqa: E731
    order = sorting(ids, rows(stored))
    assert [stored[k] for k in order] == ids
    odd = sorted([b"\x00" * 7 + b"\x01\x02", b"\x00" * 8 + b"\x01", b"\xff" * 9])  # 9 bytes: two words, padded
    assert [odd[::-1][k] for k in sorting(odd, rows(odd[::-1]))] == odd
    for bad in (stored[:-1] + [secrets.token_bytes(16)], stored[:-1] + stored[:1], stored[:-1], stored + [bytes(16)]):
        with pytest.raises(SyncError):
            sorting(ids, rows(bad))
