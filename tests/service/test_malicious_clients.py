"""Issue 12's attacks on real servers: clients that upload keys encoding something other than one
unit step. Each forged report is excluded at the close under its reason class, honest reports never
are, and with noise off the release equals the honest reports' exact counts, as if the attacker had
sent nothing."""
from __future__ import annotations

import secrets
from collections import Counter

import numpy as np
import pytest

from dpcdf.release.calibration import fixed_point
from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.verification import maths as V, randomness as RND
from dpcdf.service import hpke
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import http
from dpcdf.service.task import TaskConfig
from dpcdf.service.wire import ID_BYTES, Report, Sealer, encode_batch, join_share, split_share
from fss import DPF
from fss import field as F
from fss import reference as R
from helpers import urls, values

P = F.P
OFF_GRID = {"kind": "thresholds", "values": [float(v) for v in range(50)]}  # 50 points, 6-bit keys: 50..63 off the grid


def seal(config: TaskConfig, shares: tuple[bytes, bytes], rid: bytes | None = None) -> bytes:
    """A report whose two sealed shares are exactly these bytes (what a malicious client can send),
    in the format clients make (`wire`, format 2)."""
    rid = rid or secrets.token_bytes(ID_BYTES)
    sealed = []
    for party in (0, 1):
        sealer = Sealer(hpke.public_key(config.kem, config.hpke_keys[party]), config.fingerprint, party, config.kem)
        sealed.append((sealer.capsule, sealer.seal(rid, shares[party])))
    return Report(config.fingerprint, rid, (sealed[0], sealed[1])).to_bytes()


def honest_extras(config: TaskConfig) -> tuple[np.ndarray, np.ndarray]:
    """An honest client's check extras (without the MAC's part, which `with_mac` adds)."""
    x0, x1 = V.Check(config.payload, config.make_grid().size).client_extras(np.ones((1, config.width), np.int64))
    return x0[0], x1[0]


def with_mac(config: TaskConfig, beta, x0, x1, kappa: int | None = None) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The keys' payload (beta, kappa * beta) and each server's extras (x, kappa * x, kappa) shared,
    for any payload beta (field elements) and extras: what a client that keeps its MAC consistent
    sends, whatever else it forges (`verify.Check.client_report`)."""
    k = secrets.randbelow(P - 1) + 1 if kappa is None else kappa
    beta = [int(b) % P for b in np.atleast_1d(np.asarray(beta, dtype=object))]
    beta = beta * config.width if len(beta) == 1 else beta
    x = [(int(a) + int(b)) % P for a, b in zip(x0, x1)]
    parts = x + [k * v % P for v in x] + [k]
    share0 = [secrets.randbelow(P) for _ in parts[len(x):]]
    ext0 = [int(v) for v in x0] + share0
    ext1 = [int(v) for v in x1] + [(v - s) % P for v, s in zip(parts[len(x):], share0)]
    return beta + [k * b % P for b in beta], np.array(ext0, np.uint64), np.array(ext1, np.uint64)


def forged(config: TaskConfig, alpha: int, beta=1, extras=None) -> tuple[bytes, bytes]:
    """Both shares of a key pair for [t >= alpha] with payload beta (any field element), with the
    client's check randomness (honest unless given) and a consistent MAC."""
    x0, x1 = extras if extras is not None else honest_extras(config)
    key_beta, e0, e1 = with_mac(config, beta, x0, x1)
    k0, k1 = config.key_dcf().gen(alpha, key_beta)
    return join_share(k0.to_bytes(), e0), join_share(k1.to_bytes(), e1)


def on_grid(config: TaskConfig, shares: tuple[bytes, bytes]) -> np.ndarray:
    """The function a pair of shares encodes, at the grid's points (signed, one row per component;
    with the MAC's kappa * beta components after the report's own)."""
    fn, size = config.key_dcf(), config.make_grid().size
    keys = [split_share(share, fn.key_size, config.check().extras)[0] for share in shares]
    grids = [fn.eval_grid(fn.batch_from_keys([k], party), size) for party, k in enumerate(keys)]
    return np.asarray(fn.reconstruct(*grids, signed=True)).reshape(size, fn.width)


def reason(config: TaskConfig, shares: tuple[bytes, bytes]) -> str | None:
    """The class a report with honest check randomness must be excluded under, from the function it
    encodes on the grid: `mac` if its kappa * beta components are not one kappa times its values,
    else none for one unit step, `weight` if its value at the top is not one report, else `shape`."""
    both = on_grid(config, shares)
    w = config.width
    y, tags = [[int(v) % P for v in col] for col in both[:, :w].T], [[int(v) % P for v in col] for col in both[:, w:].T]
    first = next(((c, i) for c, col in enumerate(y) for i, v in enumerate(col) if v), None)
    kappa = 0 if first is None else tags[first[0]][first[1]] * pow(y[first[0]][first[1]], P - 2, P) % P
    if any(t != kappa * v % P for col, tcol in zip(y, tags) for v, t in zip(col, tcol)):
        return "mac"
    total = both[:, :w].sum(axis=1)
    if total[-1] != 1:
        return "weight"
    return None if np.all(np.diff(np.concatenate([[0], total])) >= 0) else "shape"


def tampered(config: TaskConfig, alpha: int, how: str, level: int) -> tuple[bytes, bytes]:
    """An honest pair with one of server 1's correction words replaced, drawn again until the
    replacement changes the function on the grid: a correction word is applied only where server
    1's control bit is 1, so a tamper can leave every grid value as it was (for the control-bit flip
    at level 2 of a 6-bit key with probability about 1/16), and that report is honest."""
    fn, w = config.key_dcf(), config.width
    x0, x1 = honest_extras(config)
    while True:
        key_beta, e0, e1 = with_mac(config, 1, x0, x1)
        k0, k1 = fn.gen(alpha, key_beta)
        ref = R.decode(fn.params, k1.to_bytes())
        if how == "payload":  # +5 on the values' correction word and +5 kappa on the MAC's: consistent
            kappa = key_beta[w] * pow(key_beta[0], P - 2, P) % P
            ref.cw_v[level] = [(int(ref.cw_v[level][e]) + (5 if e < w else 5 * kappa)) % P for e in range(fn.width)]
        elif how == "control":
            tl, tr = ref.cw_t[level]
            ref.cw_t[level] = (tl ^ 1, tr)
        else:  # random correction words at every level
            for i in range(fn.bits):
                ref.cw_v[i] = [secrets.randbelow(P) for _ in range(fn.width)]
        shares = join_share(k0.to_bytes(), e0), join_share(R.encode(fn.params, ref), e1)
        if reason(config, shares) is not None:
            return shares


def upload(config: TaskConfig, reports: list[bytes]) -> None:
    for url in config.servers:
        res = http("POST", f"{url}/tasks/{config.task_id}/reports/batch", encode_batch(reports),
                   content_type="application/octet-stream")
        assert res["accepted"] == len(reports) and not res["rejected"], res


def close(config: TaskConfig, token: str) -> dict:
    views = [http("POST", f"{u}/tasks/{config.task_id}/close", b"", token) for u in config.servers]
    assert views[0]["reports_hash"] == views[1]["reports_hash"]
    assert views[0]["rejected"] == views[1]["rejected"]
    return views[0]


def test_forged_count_reports_are_excluded_by_class_and_change_nothing(servers):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), OFF_GRID, 1.0, "tree", "substitution", min_batch=0)
    assert config.verify
    vals = values(300, 12) % 49.0
    submit(config, vals, batch=100)
    fn = config.dcf()
    bad = {"weight": [forged(config, 7, 0), forged(config, 7, 2), forged(config, 7, 10**6), forged(config, 7, P - 1),
                      forged(config, 55), forged(config, 63)],  # payload 0, 2, 10^6, -1; steps off the grid
           "shape": []}
    x0, x1 = honest_extras(config)
    lying = (x0.copy(), x1.copy())
    lying[1][1] = (int(lying[1][1]) + 1) % P  # A != a^2
    bad["shape"].append(forged(config, 20, 1, lying))
    key_beta, e0, e1 = with_mac(config, 1, *honest_extras(config))
    e1[-1] = (int(e1[-1]) + 1) % P  # an honest step whose MAC key shares disagree with its tags
    k0, k1 = config.key_dcf().gen(12, key_beta)
    bad["mac"] = [(join_share(k0.to_bytes(), e0), join_share(k1.to_bytes(), e1))]
    expected = Counter({cls: len(shares) for cls, shares in bad.items()})
    # tampered correction words (a payload correction makes blocks of -5, which may reach the top)
    # and the same report id with keys of two pairs: the class follows from what they encode
    others = [tampered(config, 30, "payload", fn.bits - 2), tampered(config, 10, "control", 2),
              tampered(config, 40, "random", 0), (forged(config, 3)[0], forged(config, 33)[1])]
    expected.update(reason(config, shares) for shares in others)
    reports = [seal(config, s) for cls in bad.values() for s in cls] + [seal(config, s) for s in others]
    upload(config, reports)
    view = close(config, token)
    assert view["n"] == 300
    assert view["rejected"] == dict(expected)
    counts, n = Analyst(config, token).prefix_counts(list(range(50)))
    np.testing.assert_array_equal(counts, prefix_counts(vals, config.make_grid()))
    assert n == 300


def test_forged_label_reports_are_excluded(servers):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), OFF_GRID, 1.0, "tree", "add-remove", min_batch=0, payload="label")
    vals, labels = values(120, 3) % 49.0, np.arange(120) % 2
    submit(config, vals, labels=labels, batch=60)
    cases = {"weight": [(1, 1), (0, 0)], "shape": [(2, P - 1), (P - 1, 2)]}
    reports = [seal(config, forged(config, 9, beta)) for betas in cases.values() for beta in betas]
    upload(config, reports)
    view = close(config, token)
    assert view["rejected"] == {"shape": 2, "weight": 2}
    counts, _ = Analyst(config, token).prefix_counts([0, 10, 25, 49])
    grid = config.make_grid()
    for e, lab in enumerate((1, 0)):
        np.testing.assert_array_equal(counts[:, e], prefix_counts(vals[labels == lab], grid)[[0, 10, 25, 49]])


def test_dpf_keys_and_garbage_extras_are_refused_at_upload(servers):
    procs, _ = servers
    config, _ = create_task(urls(procs["exact"]), OFF_GRID, 1.0, "tree", "substitution", min_batch=0)
    key_beta, x0, x1 = with_mac(config, 1, *honest_extras(config))
    k0, k1 = DPF(config.dcf().bits, width=config.check().key_width, group="p61").gen(5, key_beta)
    big = x0.copy()
    big[0] = P  # not a field element
    good = config.key_dcf().gen(5, key_beta)
    raws = [seal(config, (join_share(k0.to_bytes(), x0), join_share(k1.to_bytes(), x1))),
            seal(config, (forged(config, 5)[0][:-8], forged(config, 5)[1][:-8])),  # extras cut short
            seal(config, (join_share(good[0].to_bytes(), big), join_share(good[1].to_bytes(), x1)))]
    res = http("POST", f"{config.servers[0]}/tasks/{config.task_id}/reports/batch", encode_batch(raws),
               content_type="application/octet-stream")
    assert res["accepted"] == 0 and [r["index"] for r in res["rejected"]] == [0, 1, 2]


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_honest_reports_are_never_excluded(servers, relation):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), OFF_GRID, 1.0, "path", relation, min_batch=0)
    vals = values(1500, 40) % 49.0
    submit(config, vals, batch=500)
    view = close(config, token)
    assert view["rejected"] == {}
    counts, _ = Analyst(config, token).prefix_counts([49])
    assert counts[0] == 1500


def test_forged_calibration_reports_are_excluded(servers):
    """Probabilities out of [0, 2^16] (bits that claim them, or bits that claim an in-range q the
    payload does not carry), a label of 2, and a score on another step than the unit: each excluded,
    and with noise off the group sums equal the honest reports' exact sums."""
    procs, _ = servers
    grid = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 5}
    config, token = create_task(urls(procs["exact"]), grid, 1.0, "tree", "substitution", min_batch=0, payload="calibration")
    assert config.verify
    rng = np.random.default_rng(8)  # the simulated data only
    p, y = rng.uniform(0, 1, 200), rng.integers(0, 2, 200)
    submit(config, p, labels=y, batch=100)
    fn = config.key_dcf()

    def keys(alpha, beta, bits_of, kappa=None):
        x0, x1 = RND.calibration_extras(np.array([RND.range_bits(bits_of)] if isinstance(bits_of, int) else [bits_of], dtype=object))
        key_beta, e0, e1 = with_mac(config, beta, x0[0], x1[0], kappa)
        return fn.gen(alpha, key_beta), (e0, e1)

    def report(alpha, beta, bits_of):
        (k0, k1), (e0, e1) = keys(alpha, beta, bits_of)
        return seal(config, (join_share(k0.to_bytes(), e0), join_share(k1.to_bytes(), e1)))

    big, neg = (1 << 16) + 1, P - 1
    reports = [report(3, (1, 1, big), [1] * 16 + [2]),       # q = 2^16 + 1: its "bits" are not bits
               report(3, (1, 0, big), 100),                   # bits of an in-range q that is not the payload's
               report(4, (1, 1, neg), 0),                     # q = -1
               report(5, (1, 2, 5), 5)]                       # label 2
    (k0, _), (e0, _) = keys(6, (1, 1, 7), 7, kappa=3)
    (_, k1b), (_, e1b) = keys(9, (1, 1, 7), 7, kappa=3)  # two pairs under one kappa: the MAC holds, the shape not
    reports.append(seal(config, (join_share(k0.to_bytes(), e0), join_share(k1b.to_bytes(), e1b))))
    upload(config, reports)
    view = close(config, token)
    assert view["n"] == 200 and sum(view["rejected"].values()) == len(reports)
    assert view["rejected"].get("range", 0) >= 2
    edges = [7, 15, 23]
    sums = Analyst(config, token).group_sums(edges)
    idx = config.make_grid().index(p)
    bounds = [-1] + edges + [31]
    q = fixed_point(p).astype(np.int64)
    for g, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        inside = (idx > lo) & (idx <= hi)
        np.testing.assert_array_equal(sums[g], [inside.sum(), y[inside].sum(), q[inside].sum()])
