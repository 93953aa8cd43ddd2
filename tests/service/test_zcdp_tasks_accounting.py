"""An independent review of the rho-zCDP tasks (the square-root factorization and the Gaussian tree on
the two servers): every attempt to break a privacy or correctness claim, as a test that asserts the
claim holds. The accounting against a brute force of the mechanism's own release at sizes the other
tests do not cover; what an analyst can get from the servers (kinds, malformed bodies, repeated
questions, noiseless values); the noise's domains and the PRF sampler's exact uniformity; R x in
both groups against Python integers; config validation; forged reports on a verified zCDP task."""
from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dpcdf import ParameterError
from dpcdf.release.ecdf import prefix_counts
from dpcdf.release.factorization import column_sensitivities, right_factor, right_factor_times, sqrt_factorization
from dpcdf.release.noise import prf_key
from dpcdf.release.zcdp import GaussianVariance, PrfStream, calibrate_sigma2, check_rho, gaussian_tree, prf_dgauss
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import ServerError, http
from dpcdf.service.task import TaskConfig
from dpcdf.service.wire import encode_batch
from fss import field as F
from helpers import GRID, OPERATOR, urls, values
from test_malicious_clients import forged, honest_extras
from test_malicious_clients import seal

P = F.P
RELATIONS = ["substitution", "add-remove"]
OFF_GRID = {"kind": "thresholds", "values": [float(v) for v in range(50)]}  # 50 points, 6-bit keys: 50..63 off it


def no_noise(ids, scale):
    return np.zeros(np.asarray(ids).size, np.int64)


def _cfg(**change) -> TaskConfig:
    base = dict(grid=GRID, epsilon=None, mechanism="factorization", relation="substitution", min_batch=0,
                servers=("http://a", "http://b"), hpke_keys=("00", "01"), token_hash="0" * 64, privacy="zcdp", rho=0.5)
    return TaskConfig(**(base | change))


def _seed(data_dir: Path, task_id: str) -> bytes:
    db = sqlite3.connect(str(data_dir / "server.sqlite"))
    (seed,) = db.execute("SELECT noise_seed FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    db.close()
    return bytes(seed)


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


# --- on the servers ---------------------------------------------------------------------------------
def _task(pair, mechanism="factorization", relation="substitution", verify=None, grid=GRID, rho=0.5, epsilon=None, payload="count"):
    return create_task(urls(pair), grid, epsilon, mechanism, relation, min_batch=0, verify=verify, rho=rho, payload=payload)


def _post(config: TaskConfig, token: str, server: int, body: bytes) -> dict:
    return http("POST", f"{config.servers[server]}/tasks/{config.task_id}/query", body, token)


@pytest.mark.parametrize("field", ["rho", "epsilon"])
def test_registering_a_task_with_a_huge_integer_budget_is_a_400(servers, field):
    """The operator's POST /tasks with valid JSON whose rho (a zCDP task) or epsilon (a pure task: the
    same check, from before zCDP) is a 400-digit integer: refused (400), not a server error."""
    procs, _ = servers
    url = urls(procs["exact"])[0]
    keys = [http("GET", f"{u}/hpke")["keys"]["x25519"] for u in urls(procs["exact"])]
    change = {} if field == "rho" else {"privacy": "pure", "rho": None, "epsilon": 0.5, "mechanism": "tree"}
    d = json.loads(_cfg(servers=tuple(urls(procs["exact"])), hpke_keys=tuple(keys), verify=False, **change).to_json())
    body = json.dumps(d, separators=(",", ":")).replace(f'"{field}":0.5', f'"{field}":1' + "0" * 400).encode()
    assert f'"{field}":1000'.encode() in body
    assert _status(http, "POST", f"{url}/tasks", body, OPERATOR) == 400


def test_an_analyst_gets_the_planned_release_only(servers):
    """On a factorization task: prefix, nodes, groups refused (400) on each server, before and after
    the close; a malformed question is a 4xx, never a 5xx; 'coordinates' asked again (or with an
    ignored extra member) is the same shares on each server: no fresh noise. Other tasks (the zCDP
    tree, pure path, tree, label and calibration) refuse 'coordinates'."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = _task(pair, verify=False)
    submit(config, values(40, 21))
    for server in (0, 1):
        for q in ({"kind": "prefix", "indices": [0]}, {"kind": "nodes", "level": 0}, {"kind": "groups", "edges": [3]}):
            assert _status(_post, config, token, server, json.dumps(q).encode()) == 400
    assert _status(_post, config, token, 0, b'{"kind": "coordinates"}') == 409  # not closed yet
    analyst = Analyst(config, token)
    y, n = analyst._ask({"kind": "coordinates"})
    assert y.size == 65 and n == 40 and y[-1] == 40
    first = [_post(config, token, s, b'{"kind": "coordinates"}') for s in (0, 1)]
    for s in (0, 1):
        assert _post(config, token, s, b'{"kind": "coordinates"}')["shares"] == first[s]["shares"]
        assert _post(config, token, s, b'{"kind": "coordinates", "extra": 1}')["shares"] == first[s]["shares"]
        for q in ({"kind": "prefix", "indices": [0]}, {"kind": "nodes", "level": 6}, {"kind": "groups", "edges": []}):
            assert _status(_post, config, token, s, json.dumps(q).encode()) == 400
    malformed = [b'{"kind": ["coordinates"]}', b'{"kind": {"a": 1}}', b'{"kind": null}', b'{"kind": 1}', b'{"kind": true}',
                 b'{"kind": "COORDINATES"}', b'{"kind": "coordinates "}', b'{}', b'[]', b'"coordinates"', b'null', b'7',
                 b'{"kind": "coordinates"', b'\xff\xfe', b'', b'{"kind": "prefix", "indices": "all"}',
                 b'{"kind": "nodes", "level": "0"}', b'[{"kind": "coordinates"}]']
    for body in malformed:
        for s in (0, 1):
            code = _status(_post, config, token, s, body)
            assert 400 <= code < 500, (body, code)
    assert _status(_post, config, "wrong-token", 0, b'{"kind": "coordinates"}') == 401
    again, _ = analyst._ask({"kind": "coordinates"})
    np.testing.assert_array_equal(again, y)
    others = [_task(pair, "tree"), _task(pair, "path", rho=None, epsilon=1.0), _task(pair, "tree", rho=None, epsilon=1.0),
              _task(pair, "tree", "add-remove", rho=None, epsilon=1.0, payload="label"),
              _task(pair, "tree", rho=None, epsilon=1.0, payload="calibration", grid={"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 4})]
    for other, other_token in others:
        labels = None if other.payload == "count" else np.arange(12) % 2
        submit(other, values(12, 22) / (100 if other.payload == "calibration" else 1), labels=labels)
        Analyst(other, other_token).close()
        for s in (0, 1):
            assert _status(_post, other, other_token, s, b'{"kind": "coordinates"}') == 400


@pytest.mark.parametrize("relation", RELATIONS)
def test_the_coordinates_are_r_x_plus_both_servers_noise_and_nothing_noiseless(servers, relation):
    """White box on the noisy servers (unverified: shares mod 2^64): under add/remove no n (not in the
    answer, not as a share, not in the close or the status), m values each R x + z0 + z1, both
    servers' noise from their own seeds (per task: two tasks of one server have different seeds);
    under substitution the same, then n. Each server's shares alone look nothing like R x."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = _task(pair, relation=relation, verify=False)
    config2, _ = _task(pair, relation=relation, verify=False)
    vals = values(60, 23)
    submit(config, vals)
    analyst = Analyst(config, token)
    closed = analyst.close()
    answers = [_post(config, token, s, b'{"kind": "coordinates"}') for s in (0, 1)]
    status = [http("GET", f"{u}/tasks/{config.task_id}", None, token) for u in config.servers]
    m = config.make_grid().size
    public = relation == "substitution"
    assert all(len(a["shares"]) == m + public for a in answers)
    assert all((a["n"] == 60) if public else (a["n"] is None) for a in answers)
    assert (closed == 60) if public else (closed is None)
    assert all((st["reports"] == 60) if public else (st["reports"] is None) for st in status)
    y, _ = analyst._ask({"kind": "coordinates"})
    truth = prefix_counts(vals, config.make_grid())
    rx = np.convolve(np.diff(truth, prepend=0), right_factor(m))[:m]
    noise = []
    for s, (_, _, data_dir) in enumerate(pair):
        seed = _seed(data_dir, config.task_id)
        assert seed != _seed(data_dir, config2.task_id) and seed != _seed(pair[1 - s][2], config.task_id)
        agg = Aggregator(config.dcf(), config.make_mechanism(), seed, config.task_id)
        alone = agg.coordinate_shares([]).view(np.int64)
        noise.append(alone[:m])
        own = np.array([int(v) for v in answers[s]["shares"]], np.uint64).view(np.int64)[:m]
        assert np.count_nonzero(np.abs(own - rx) < 10**7) <= 2  # a share is not R x plus small noise
    np.testing.assert_array_equal(y[:m], rx + noise[0] + noise[1])
    assert np.count_nonzero(noise[0]) >= m - 2 and np.count_nonzero(noise[1]) >= m - 2
    assert np.count_nonzero(noise[0] + noise[1]) >= m - 2  # the servers' noises do not cancel
    if public:
        assert y[m] == 60


def _forged(config: TaskConfig, alpha: int, beta=1, lie: bool = False) -> tuple[bytes, bytes]:
    """A malicious client's report with a consistent MAC (`test_malicious_clients.forged`); `lie`:
    its pair (a, A) has A != a^2."""
    x0, x1 = honest_extras(config)
    x0, x1 = x0.copy(), x1.copy()
    if lie:
        x1[1] = (int(x1[1]) + 1) % P
    return forged(config, alpha, beta, (x0, x1))


@pytest.mark.parametrize("relation", RELATIONS)
def test_forged_reports_on_a_verified_factorization_task_change_nothing(servers, relation):
    """A malicious client's reports (payload 0, 2, 10^6, -1; a step off the grid; a lying check)
    on a verified zCDP factorization task: excluded at the close, and with noise off the coordinates
    are exactly R x of the honest reports (then n = the honest count under substitution)."""
    procs, _ = servers
    config, token = _task(procs["exact"], relation=relation, grid=OFF_GRID)
    assert config.verify and config.dcf().modulus == P
    vals = values(90, 24) % 49.0
    submit(config, vals, batch=45)
    bad = [_forged(config, 7, 0), _forged(config, 7, 2), _forged(config, 7, 10**6), _forged(config, 7, P - 1),
           _forged(config, 55), _forged(config, 63), _forged(config, 20, 1, lie=True)]
    reports = [seal(config, s) for s in bad]
    for url in config.servers:
        res = http("POST", f"{url}/tasks/{config.task_id}/reports/batch", encode_batch(reports),
                   content_type="application/octet-stream")
        assert res["accepted"] == len(reports)
    analyst = Analyst(config, token)
    analyst.close()
    assert sum(analyst.rejected.values()) == len(bad)
    y, n = analyst._ask({"kind": "coordinates"})
    m = config.make_grid().size
    truth = prefix_counts(vals, config.make_grid())
    np.testing.assert_array_equal(y[:m], np.convolve(np.diff(truth, prepend=0), right_factor(m))[:m])
    if relation == "substitution":
        assert y.size == m + 1 and y[m] == n == 90
    else:
        assert y.size == m and n == 0
    rel = analyst.release()
    np.testing.assert_allclose(rel.counts, truth, atol=1e-6)


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


def test_the_cli_refuses_bad_zcdp_tasks_cleanly(servers, tmp_path):
    """`dpcdf task` with a bad rho, a pure mechanism with --rho, the factorization with --epsilon, or
    a grid too large for the factorization: exit code 2 and one line, no traceback, no task file."""
    import os

    from helpers import TESTING

    procs, _ = servers
    env = dict(os.environ, **TESTING)
    for i, args in enumerate([["--rho", "nan"], ["--rho", "-1"], ["--rho", "0.5", "--mechanism", "path"],
                              ["--epsilon", "1", "--mechanism", "factorization"],
                              ["--rho", "0.5", "--grid", "uniform:0:1:14"]]):
        out = tmp_path / f"t{i}.json"
        grid = [] if "--grid" in args else ["--grid", "uniform:0:100:6"]
        run = subprocess.run([sys.executable, "-m", "dpcdf", "task", "--servers", *urls(procs["exact"]), *grid, *args,
                              "--min-batch", "0", "--out", str(out)], capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 2 and "Traceback" not in run.stderr and run.stderr.strip(), (args, run.stderr[-400:])
        assert not out.exists()
