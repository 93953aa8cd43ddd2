"""rho-zCDP tasks in process, the findings of their independent review (the square-root factorization
and the Gaussian tree): every attempt to break a privacy or correctness claim, as a test that asserts
the claim holds. The accounting against a brute force of the mechanism's own release at sizes the other
tests do not cover; the noise's domains and the PRF sampler's exact uniformity; R x in both groups
against Python integers; config validation. The review's attempts on the servers (what an analyst can
get from them, forged reports on a verified zCDP task) are in tests/service/system/test_zcdp_tasks.py."""
from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dpcdf import ParameterError
from dpcdf.release.factorization import column_sensitivities, right_factor, right_factor_times, sqrt_factorization
from dpcdf.release.noise import prf_key
from dpcdf.release.zcdp import GaussianVariance, PrfStream, calibrate_sigma2, check_rho, gaussian_tree, prf_dgauss
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.http import ServerError
from dpcdf.service.task import TaskConfig
from fss import field as F
from helpers import GRID


P = F.P
RELATIONS = ["substitution", "add-remove"]
OFF_GRID = {"kind": "thresholds", "values": [float(v) for v in range(50)]}  # 50 points, 6-bit keys: 50..63 off it



def no_noise(ids, scale):
    return np.zeros(np.asarray(ids).size, np.int64)


def _cfg(**change) -> TaskConfig:
    base = dict(grid=GRID, epsilon=None, mechanism="factorization", relation="substitution", min_batch=0,
                servers=("http://a", "http://b"), hpke_keys=("00", "01"), token_hash="0" * 64, privacy="zcdp", rho=0.5)
    return TaskConfig(**(base | change))


def _status(fn, *args) -> int:
    """The HTTP status a request is answered with (200 if it succeeds)."""
    try:
        fn(*args)
    except ServerError as exc:
        assert exc.status is not None, str(exc)
        return exc.status
    return 200


# --- the accounting, brute-forced on the mechanism's own release ---------------------------------
@pytest.mark.parametrize("size", [100, 127, 257])
def test_exact_rho_is_the_worst_neighbour_pair_of_the_release(size):
    """Both calibrations, both relations: the release of every one-value data set (the release is
    linear in the data, so a common background cancels: checked on random backgrounds too); the
    worst neighbour pair's ||y - y'||^2 / (2 sigma^2) is exact_rho, at most rho; the appended n never
    moves under substitution, and the substitution release gives no add/remove guarantee (adding one
    value moves its noiseless n)."""
    rho = 0.37
    eye = np.eye(size, dtype=np.int64)
    for calibrated in RELATIONS:
        mech = sqrt_factorization(size, rho, calibrated)
        rows = np.array([mech.noisy(np.cumsum(eye[a]), no_noise) for a in range(size)])
        empty = mech.noisy(np.zeros(size, np.int64), no_noise)
        rng = np.random.default_rng(size)  # backgrounds for the linearity check
        for _ in range(3):
            bg = np.cumsum(rng.integers(0, 50, size))
            a = int(rng.integers(size))
            np.testing.assert_array_equal(mech.noisy(bg + np.cumsum(eye[a]), no_noise) - mech.noisy(bg, no_noise), rows[a] - empty)
        if calibrated == "substitution":
            assert np.all(rows[:, -1] == 1) and empty[-1] == 0  # n: equal across substitution neighbours ...
            assert mech.exact_rho("add-remove") is None and mech.rho_for("add-remove") == float("inf")
            assert mech.epsilon_for("add-remove") == float("inf") and "no DP guarantee" in mech.statement("add-remove")
            rows, empty = rows[:, :-1], empty[:-1]  # ... but not across add/remove ones: no guarantee there
        sub = max(int(((rows[a] - rows) ** 2).sum(axis=1).max()) for a in range(size))
        add = int(((rows - empty) ** 2).sum(axis=1).max())
        assert (add, sub) == column_sensitivities(size)
        assert mech.exact_rho("substitution") == Fraction(sub) / (2 * Fraction(mech.sigma2))
        assert mech.exact_rho(calibrated) <= Fraction(rho)
        assert Fraction(rho) - mech.exact_rho(calibrated) < Fraction(rho) / 10**5
        if calibrated == "add-remove":
            assert mech.exact_rho("add-remove") == Fraction(add) / (2 * Fraction(mech.sigma2))
            assert "zCDP under substitution" in mech.statement("substitution")


@pytest.mark.parametrize("size", [50, 64, 100])
def test_the_zcdp_tree_accounting_is_the_worst_neighbour_pair_of_its_release(size):
    """The other zCDP task mechanism, brute-forced the same way: over every released level, the noised
    nodes' worst ||y - y'||^2 / (2 sigma^2) is its exact_rho (<= rho), and an unnoised released value
    (the public root under substitution) never differs between neighbours."""
    rho = 0.37
    eye = np.eye(size, dtype=np.int64)
    for calibrated in RELATIONS:
        mech = gaussian_tree(size, rho, calibrated)
        rel = [mech.noisy(np.cumsum(eye[a]), no_noise) for a in range(size)]
        empty = mech.noisy(np.zeros(size, np.int64), no_noise)
        noised = [lv for lv in range(len(mech.scales)) if mech.scales[lv] is not None]
        exact = [lv for lv in mech.released_levels() if lv not in noised]

        def flat(r):
            return np.concatenate([r[lv] for lv in noised])

        rows = np.array([flat(r) for r in rel])
        for lv in exact:  # released without noise: must not move between neighbours
            assert all(np.array_equal(r[lv], rel[0][lv]) for r in rel)
        sub = max(int(((rows[a] - rows) ** 2).sum(axis=1).max()) for a in range(size))
        if calibrated == "substitution":
            assert Fraction(sub) / (2 * Fraction(mech.sigma2)) == mech.exact_rho("substitution") <= Fraction(rho)
        else:
            assert not exact
            add = int(((rows - flat(empty)) ** 2).sum(axis=1).max())
            assert Fraction(add) / (2 * Fraction(mech.sigma2)) == mech.exact_rho("add-remove") <= Fraction(rho)
            assert Fraction(sub) / (2 * Fraction(mech.sigma2)) <= mech.exact_rho("substitution")
        if calibrated == "substitution":
            assert mech.exact_rho("add-remove") is None


@pytest.mark.parametrize("rho", [1e-9, 1e-6, 0.1, 1 / 3, 0.5, 0.7234567891234, 2.0, 123.456, 1e6])
def test_sigma2_is_rounded_up_for_every_rho(rho):
    """sigma^2 >= Delta2 / (2 rho) exactly (so Delta2 / (2 sigma^2) <= rho), a rational of denominator
    at most 2^20, for the factorization's sensitivities and for small and odd Delta2."""
    for delta2 in (1, 2, 7, 3**20 + 1, *column_sensitivities(100), *column_sensitivities(4096)):
        s2 = calibrate_sigma2(delta2, rho)
        assert isinstance(s2, GaussianVariance) and s2.denominator <= 1 << 20
        assert Fraction(delta2) / (2 * Fraction(s2)) <= Fraction(rho)
    for relation in RELATIONS:
        assert sqrt_factorization(64, rho, relation).exact_rho(relation) <= Fraction(rho)
        assert gaussian_tree(64, rho, relation).exact_rho(relation) <= Fraction(rho)


def _recording():
    asked = []

    def noise(ids, scale):
        asked.append((np.asarray(ids, np.int64).copy(), scale))
        return np.full(np.asarray(ids).size, 1000, np.int64)

    return asked, noise


@pytest.mark.parametrize("relation", RELATIONS)
def test_every_released_value_carries_noise(relation):
    """White box: the factorization asks its noise for each coordinate exactly once, at the
    calibrated N_Z(0, sigma^2), and releases nothing else but n (substitution only); the zCDP tree
    (the other zCDP task mechanism) puts noise on every prefix a server answers, also at the last
    index (n, private under add/remove), and on every released node but a public root."""
    size = 64
    mech = sqrt_factorization(size, 0.5, relation)
    asked, noise = _recording()
    y = mech.noisy(np.cumsum(np.ones(size, np.int64)), noise)
    ids = np.concatenate([a for a, _ in asked])
    assert sorted(ids.tolist()) == list(range(size))
    assert all(isinstance(s, GaussianVariance) and s == mech.sigma2 for _, s in asked)
    assert y.size == size + (relation == "substitution")
    if relation == "substitution":
        assert y[-1] == size
    tree = gaussian_tree(size, 0.5, relation)
    asked, noise = _recording()
    out = tree.prefix_noise(np.arange(size), noise)
    assert all(isinstance(s, GaussianVariance) for _, s in asked)
    assert np.all(out[:-1] != 0) and (out[-1] == 0) == (relation == "substitution")  # the root is n: public or noised
    for level in tree.released_levels():
        asked, noise = _recording()
        nodes = tree.node_noise(level, np.arange(tree.level_nodes(level)), noise)
        public_root = relation == "substitution" and level == tree.shape.height
        assert np.all(nodes == 0) if public_root else np.all(nodes != 0)


def test_the_error_estimate_works_at_every_allowed_rho():
    """check_rho allows rho down to 1e-9: the factorization's expected error (which every release
    reports, `finish_release` -> `expected_mse`) must come out at small rho too, in bounded memory.
    Var(N_Z(0, s2)) is s2 to within exp(-2 pi^2 s2) here. Run in a child with 3 GB of address space."""
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        import numpy as np
        from dpcdf.release.factorization import left_factor, sqrt_factorization
        for rho in (1e-9, 1e-6, 1e-4):  # smallest first: without the rlimit they fail at once
            mech = sqrt_factorization(64, rho, "add-remove")
            trace = float(np.cumsum(left_factor(64) ** 2).sum())
            want = float(mech.sigma2) * trace / 64
            got = mech.expected_mse()
            assert abs(got - want) <= 1e-6 * want, (rho, got, want)
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-600:]


# --- the PRF sampler -------------------------------------------------------------------------------
def _words(key: bytes, node_id: int, count: int) -> list[int]:
    """The keystream AES_key(id || j) as 64-bit little-endian words, block by block."""
    from Crypto.Cipher import AES

    ecb, out, j = AES.new(key, AES.MODE_ECB), [], 0
    while len(out) < count:
        out += [int(w) for w in np.frombuffer(ecb.encrypt(np.array([node_id, j], "<u8").tobytes()), "<u8")]
        j += 1
    return out[:count]


def _reference_randbelow(words: list[int], m: int) -> tuple[int, int]:
    """Textbook rejection sampling: (value, words used)."""
    w = -(-m.bit_length() // 64)
    top, pos = 1 << (64 * w), 0
    while True:
        v = 0
        for _ in range(w):
            v, pos = (v << 64) | words[pos], pos + 1
        if v < top - top % m:
            return v % m, pos


@pytest.mark.parametrize("m", [1, 2, 3, 1 << 32, (1 << 63) + 1, (1 << 64) - 1, 1 << 64, (1 << 64) + 1, 3 << 64,
                               (1 << 127) + 1, 1 << 128])
def test_prf_randbelow_is_the_reference_rejection_sampler(m):
    """PrfStream.randbelow(m) draws exactly what rejection sampling over ceil(bits(m)/64) words gives
    (so exactly uniform), word for word from the stream, also across its 16-block chunks; m = 1 is
    always 0, a power of two never rejects."""
    from Crypto.Cipher import AES

    key, node = secrets.token_bytes(16), secrets.randbelow(1 << 64)
    words = _words(key, node, 4000)
    stream = PrfStream(AES.new(key, AES.MODE_ECB), node)
    pos = 0
    for _ in range(40):
        want, used = _reference_randbelow(words[pos:], m)
        assert stream.randbelow(m) == want and 0 <= want < m
        pos += used
    if m & (m - 1) == 0:
        assert pos == 40 * -(-m.bit_length() // 64)
    if m == (1 << 63) + 1:  # half the words are rejected: the test reached rejections
        assert pos > 50


def test_prf_dgauss_is_per_id_whatever_the_batch():
    """A server asked for its noise in any batch order, again later, or in another process (no state
    but the key) gets the same sample per id; other keys or ids give other samples."""
    key, s2 = secrets.token_bytes(16), Fraction(10**9, 3)
    ids = np.array([0, 1, 2, 63, 2**32, 2**64 - 1], np.uint64)
    first = prf_dgauss(key, ids, s2)
    assert np.array_equal(prf_dgauss(key, ids[::-1], s2)[::-1], first)
    assert all(prf_dgauss(key, ids[k : k + 1], s2)[0] == first[k] for k in range(ids.size))
    assert len(set(first.tolist())) == ids.size
    assert not np.array_equal(prf_dgauss(secrets.token_bytes(16), ids, s2), first)


def test_noise_domains_are_separate():
    """One server seed: two tasks, or the factorization and the zCDP tree, or the pure tree (DLap)
    and the groups domain of one task, all have different AES keys, and two tasks' coordinate noise
    differs; two seeds (the two servers) give different noise for one task."""
    seed = secrets.token_bytes(32)
    cfg = _cfg(relation="add-remove", verify=False)
    mech, dcf = cfg.make_mechanism(), cfg.dcf()
    a = Aggregator(dcf, mech, seed, "task-a")
    b = Aggregator(dcf, mech, seed, "task-b")
    other = Aggregator(dcf, mech, secrets.token_bytes(32), "task-a")
    za, zb, zo = (agg.coordinate_shares([]).view(np.int64) for agg in (a, b, other))
    assert np.count_nonzero(za == zb) < 8 and np.count_nonzero(za == zo) < 8 and np.count_nonzero(za + zo == 0) < 8
    np.testing.assert_array_equal(Aggregator(dcf, mech, seed, "task-a").coordinate_shares([]).view(np.int64), za)
    tree = Aggregator(dcf, gaussian_tree(64, 0.5, "add-remove"), seed, "task-a")
    keys = {a.keys[0], b.keys[0], tree.keys[0], a.group_key, prf_key(seed, "task-a/tree"), other.keys[0]}
    assert len(keys) == 6


# --- R x, exactly -----------------------------------------------------------------------------------
@pytest.mark.parametrize("modulus", [1 << 64, P])
def test_right_factor_times_is_exact_and_linear_in_shares(modulus):
    """R x mod the group, against Python integers, for shares near the modulus; and a server's R x0
    plus the other's R x1 is R (x0 + x1): what the analyst adds up is R times the histogram."""
    rng = np.random.default_rng(7)  # the test's shares
    for m in (2, 3, 64, 257, 1000, 8192):
        r = [int(v) for v in right_factor(m)]
        x = rng.integers(0, modulus, m, dtype=np.uint64, endpoint=False)
        x[: m // 3] = [modulus - 1 - int(k) for k in rng.integers(0, 3, m // 3)]  # the top of the range
        x[m // 3 : m // 2] = rng.integers(0, 3, m // 2 - m // 3).astype(np.uint64)
        got = right_factor_times(x, modulus)
        assert got.dtype == np.uint64 and got.size == m
        xs = [int(v) for v in x]
        rows = range(m) if m <= 1000 else sorted({0, 1, m - 1, *rng.integers(0, m, 12).tolist()})
        for i in rows:
            assert int(got[i]) == sum(r[k] * xs[i - k] for k in range(i + 1)) % modulus, (m, i)
        hist = rng.integers(0, 40, m).astype(np.uint64)
        x0 = np.array([secrets.randbelow(modulus) for _ in range(m)], np.uint64)
        x1 = np.array([(int(h) - int(s)) % modulus for h, s in zip(hist, x0)], np.uint64)
        total = [(int(a) + int(b)) % modulus for a, b in zip(right_factor_times(x0, modulus), right_factor_times(x1, modulus))]
        assert total == [int(v) for v in np.convolve(hist.astype(np.int64), right_factor(m))[:m]]


# --- configs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("change", [
    {"rho": True}, {"rho": False}, {"rho": float("nan")}, {"rho": float("inf")}, {"rho": -0.5}, {"rho": 0}, {"rho": 0.0},
    {"rho": "0.5"}, {"rho": [0.5]}, {"rho": None}, {"rho": 1e-12}, {"rho": 1e7}, {"rho": 10**400}, {"rho": np.int64(1)},
    {"epsilon": 1.0}, {"epsilon": 0.0}, {"epsilon": False}, {"privacy": "pure", "epsilon": 1.0},
    {"privacy": "pure", "epsilon": 1.0, "rho": 0.0}, {"privacy": None}, {"privacy": ["zcdp"]}, {"privacy": "ZCDP"},
    {"mechanism": "path"}, {"mechanism": None}, {"payload": "calibration"}, {"payload": "label"}, {"verify": "yes"}, {"verify": 1},
    {"grid": {"kind": "uniform", "lo": 0, "hi": 1, "bits": 14}},
    {"grid": {"kind": "thresholds", "values": [1.0]}},
    {"mechanism": "tree", "grid": {"kind": "uniform", "lo": 0, "hi": 1, "bits": 17}, "verify": False},
    {"relation": "add-remove", "min_batch": 1}], ids=lambda c: "-".join(f"{k}={'10^400' if v == 10**400 else v}" for k, v in c.items())[:60])
def test_bad_zcdp_configs_are_parameter_errors(change):
    with pytest.raises(ParameterError):
        _cfg(**change)


@pytest.mark.parametrize("field, value", [("rho", 10**400), ("rho", "1"), ("rho", True), ("privacy", 7)],
                         ids=["rho-10^400", "rho-string", "rho-bool", "privacy-int"])
def test_a_bad_zcdp_config_from_json_is_a_parameter_error(field, value):
    """From JSON (how a server reads a task): a huge integer is valid JSON and must be refused like any
    other bad value, not escape as an OverflowError (a 500 at POST /tasks)."""
    d = json.loads(_cfg(verify=False).to_json())
    d[field] = value
    with pytest.raises(ParameterError):
        TaskConfig.from_json(json.dumps(d))
    with pytest.raises(ParameterError):
        check_rho(value) if field == "rho" else _cfg(**{field: value})


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("mechanism, bits", [("factorization", 13), ("tree", 16)])
def test_the_largest_zcdp_grids_are_accepted(mechanism, bits, verify):
    cfg = _cfg(mechanism=mechanism, grid={"kind": "uniform", "lo": 0, "hi": 1, "bits": bits}, verify=verify)
    assert cfg.verify is verify and cfg.make_mechanism().size == 1 << bits
    assert TaskConfig.from_json(cfg.to_json()) == cfg


def test_a_pure_tasks_json_has_the_old_fields_only():
    """The canonical JSON of a pure task is what it was before zCDP (no privacy or rho key, so the
    same fingerprint), explicit defaults in the JSON change nothing, and a zCDP field is refused."""
    pure = TaskConfig(GRID, 1.0, "tree", "substitution", 0, ("http://a", "http://b"), ("00", "01"), "0" * 64,
                      verify=False, task_id="t1")
    old = {"grid", "epsilon", "mechanism", "relation", "min_batch", "servers", "hpke_keys", "token_hash", "payload",
           "split", "kem", "task_id", "format"}
    assert set(json.loads(pure.to_json())) == old
    explicit = json.loads(pure.to_json()) | {"privacy": "pure", "rho": None}
    assert TaskConfig.from_json(json.dumps(explicit)).fingerprint == pure.fingerprint
    with pytest.raises(ParameterError):
        TaskConfig.from_json(json.dumps(explicit | {"rho": 0.5}))
    zcdp = _cfg(verify=False, task_id="t1")
    assert zcdp.fingerprint != pure.fingerprint and json.loads(zcdp.to_json())["privacy"] == "zcdp"


@pytest.mark.parametrize("s2", [Fraction(5, 7), Fraction(37, 10)])
def test_prf_dgauss_matches_the_exact_pmf_at_non_integer_sigma2(s2):
    """The CKS sampler on the PRF (t = floor(sigma) + 1 from floor(sigma^2)) at sigma^2 below 1 and
    between integers: 12,000 draws (a fixed key: deterministic) against the exact probabilities,
    chi-square over the central values and both tails, and symmetric."""
    from scipy import stats

    from dpcdf.release.zcdp import dgauss_pmf

    draws = prf_dgauss(bytes(range(16)), np.arange(12_000, dtype=np.uint64), s2)
    edge = 2 if s2 < 1 else 5
    support = np.arange(-edge + 1, edge)
    p = dgauss_pmf(float(s2), support)
    tail = (1 - p.sum()) / 2
    observed = [np.sum(draws <= -edge)] + [np.sum(draws == y) for y in support] + [np.sum(draws >= edge)]
    expected = draws.size * np.concatenate([[tail], p, [tail]])
    assert stats.chisquare(observed, expected).pvalue > 1e-4
    assert abs(draws.mean()) < 5 * np.sqrt(float(s2) / draws.size)
