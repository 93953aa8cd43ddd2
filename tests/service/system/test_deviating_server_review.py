"""Independent review of issue 20 (a server that deviates from the protocol), on real server processes.

What these tests add to tests/service/system/test_deviating_server.py:
- the mirror of the one-message attack, run by a deviating server 1 on a real server 0: it shifts its
  e_1 in message 6 and opens a commitment consistent with the shifted opening; a positive control
  recovers every alpha from the V_0 an unprotected server 0 would send, and the real one sends none;
- the attack on a calibration task through another opened element (d = q - a', the score check's
  Beaver opening): with V_1 at d + delta, b'_1 and hence w = rho_alpha fall out (positive control);
  the real server 1 sends no V for a shifted report and -V_0 for the others;
- racing messages to one step (only one answered, the rest 409), and a restart of server 1 between
  its commitment (6) and its opening (8): the opening is the committed one;
- single-message steps (11, 13, 1) at a chunk other than 0 (its findings, fixed: message 11 at
  chunk 1 answered 500 after running server 1's finish, message 1 could be asked again at another
  chunk, DONE at chunk 1 was acknowledged without ending the exchange; now the channel opens the
  single-message kinds at chunk 0 only). A third finding, fixed: server 0 journalled message 8 before
  checking V_1's width, so a malformed one stuck the close for good.

Each test shares test_deviating_server's server processes (one pair for both files).
"""
from __future__ import annotations

import secrets
import threading

import numpy as np

from dpcdf.service.protocols.reconciliation import maths as reconcile
from dpcdf.service.protocols.check import round_one, outcome
from dpcdf.service.protocols.check import randomness as RND
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.client import create_task, make_reports, submit
from dpcdf.service.hpke import ServerKeys
from dpcdf.service.http import ServerError, fetch, http
from dpcdf.service.protocols.channel import Kind
from dpcdf.service.protocols.check.exchange import NONCE, commitment
from dpcdf.service.server.state import pair_key
from dpcdf.service.storage.store import Store
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.service.wire import encode_batch
from fss import field as F
from deviating import OCTETS, Deviant0, deviant_channel, operator
from helpers import values
from test_deviating_server import deviant0, interceptor, patiently, servers  # noqa: F401 - one pair of servers for both files

GRID = {"kind": "uniform", "lo": 0.0, "hi": 64.0, "bits": 6}
CGRID = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 5}
N = 16


def status_of(send, message: bytes) -> int:
    try:
        patiently(send, message)
        return 200
    except ServerError as exc:
        return exc.status


def task(d: Deviant0, grid: dict, vals, payload: str = "count", labels=None) -> tuple[TaskConfig, str]:
    """`Deviant0.task` for any payload: registered on both servers, one report per value uploaded to each."""
    token = secrets.token_urlsafe(16)
    keys = (d.client.get("/hpke").json()["keys"]["x25519"], http("GET", f"{d.url1}/hpke")["keys"]["x25519"])
    config = TaskConfig(grid, 1.0, "tree", "substitution", 0, (d.URL, d.url1), keys, token_hash(token),
                        payload=payload, verify=True)
    body = config.to_json().encode()
    assert d.client.post("/tasks", content=body, headers=operator()).status_code == 201
    http("POST", f"{d.url1}/tasks", body, operator()["Authorization"].split()[1])
    reports = encode_batch([r.to_bytes() for r in make_reports(config, vals, labels)])
    assert d.client.post(f"/tasks/{config.task_id}/reports/batch", content=reports).json()["accepted"] == len(vals)
    fetch("POST", f"{d.url1}/tasks/{config.task_id}/reports/batch", reports, content_type=OCTETS)
    return config, token


def server_local(servers, config: TaskConfig, party: int) -> round_one.Local:
    """Server `party`'s own round one over R, read from its store (what that server holds)."""
    data = servers.base / f"s{party}"
    store = Store(data / "server.sqlite")
    try:
        return round_one.prepare(store, config, party, pair_key(config, party, ServerKeys(data)))
    finally:
        store.close()


def elements(data: bytes, rows: int) -> np.ndarray:
    return np.frombuffer(data, "<u8").astype(np.uint64).reshape(rows, -1)


def le(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<u8").tobytes()


def inverse(x: int) -> int:
    return pow(x % F.P, F.P - 2, F.P)


# --- direction B: a deviating server 1 shifts its opening ---------------------------------------------
def test_a_shifted_answer_from_server_1_gets_no_check_value_from_server_0(servers, interceptor):
    """The mirror of the one-message attack, by server 1 on a real server 0: message 6 carries
    e_1 + delta and a commitment to the sigma_1 an honest server 1 would compute on that opening;
    message 8 opens exactly that commitment. An unprotected server 0 would answer (9) with
    V_0(e + delta) = V_0(e) + 2 e delta + delta^2 + 2 delta a_0, from which server 1 gets a_0, z and
    alpha (positive control: every alpha recovered). The real server 0: its MAC fails for every
    report, it sends V_0 = 0 for each, and excludes them all as 'mac' (as does server 1)."""
    config, token = create_task([servers.url0, interceptor.url], GRID, 1.0, "tree", "substitution", min_batch=0)
    vals = values(N, 71) % 64
    submit(config, vals, batch=N)
    check, delta = config.check(), 1
    key1 = pair_key(config, 1, ServerKeys(servers.base / "s1"))
    ch1 = deviant_channel(config, 1, servers.base / "s1")
    seen: dict = {}

    def rewrite(path, body, status, answer):
        if not path.endswith("/verify") or status != 200:
            return None
        if body[0] == Kind.CHECK_OPEN:
            local1 = seen["local1"] = server_local(servers, config, 1)
            ctx, rows = local1.context, len(local1.ids)
            e_0 = elements(ch1.open(body, (Kind.CHECK_OPEN,), ctx).payload[outcome.HEAD:], rows)
            m = ch1.open(answer, (Kind.CHECK_ANSWER,), ctx).payload
            mine = elements(m[4:-32], rows).copy()
            mine[:, 0] = F.add(mine[:, 0], np.full(rows, delta, np.uint64))
            seen["e_0"], seen["opened"] = e_0, F.add(e_0, local1.message)
            sigma = check.mac_values(1, local1.state, F.add(e_0, mine), local1.extras)
            nonce = secrets.token_bytes(NONCE)
            seen["opening"] = nonce + le(sigma)
            return 200, ch1.seal(Kind.CHECK_ANSWER, 0, m[:4] + le(mine) + commitment(nonce, sigma), ctx)
        if body[0] == Kind.CHECK_MAC:
            ctx, rows = seen["local1"].context, N
            m = ch1.open(answer, (Kind.CHECK_MAC_OPEN,), ctx).payload
            v_1 = check.round_two(1, seen["local1"].state, seen["opened"], seen["local1"].extras)  # as if it passed
            return 200, ch1.seal(Kind.CHECK_MAC_OPEN, 0, m[:4] + seen["opening"] + le(v_1), ctx)
        if body[0] == Kind.CHECK_VALUES:
            seen["v_0"] = elements(ch1.open(body, (Kind.CHECK_VALUES,), seen["local1"].context).payload[4:], N)[:, 0]
        return None

    interceptor.rewrite = rewrite
    analyst = Analyst(config, token)
    analyst.close()
    assert "v_0" in seen, "server 0 never sent message 9"
    local0, local1 = server_local(servers, config, 0), seen["local1"]
    truth = np.sort(config.make_grid().index(vals))

    def recover(v_0_shifted: np.ndarray) -> np.ndarray:
        """Server 1's side: a_0 = (V_0(e + d) + V_1(e) - 2 e d - d^2) / 2d, z = e_0 + a_0 + z_1 = r_alpha."""
        e = seen["opened"][:, 0]
        v_1 = check.round_two(1, local1.state, seen["opened"], local1.extras)
        num = F.sub(F.add(v_0_shifted, v_1), F.add(F.mul(e, np.full(N, 2 * delta, np.uint64)),
                                                   np.full(N, delta * delta, np.uint64)))
        a_0 = F.mul(num, np.full(N, inverse(2 * delta), np.uint64))
        z = F.add(F.add(seen["e_0"][:, 0], a_0), F.add(local1.message[:, 0], local1.extras[:, 0]))
        r, _ = RND.challenges(round_one.verification_key(key1), b"dpcdf round one/" + config.task_id.encode(),
                            config.make_grid().size)
        where = {int(x): i for i, x in enumerate(r)}
        return np.array([where.get(int(x), -1) for x in z])

    shifted = seen["opened"].copy()
    shifted[:, 0] = F.add(shifted[:, 0], np.full(N, delta, np.uint64))
    unprotected = check.round_two(0, local0.state, shifted, local0.extras)
    np.testing.assert_array_equal(np.sort(recover(unprotected)), truth)  # the attack works on the arithmetic
    assert not seen["v_0"].any(), "server 0 sent check values on an opening whose MAC failed"
    assert (np.sort(recover(seen["v_0"])) != truth).any()
    view = http("POST", f"{servers.url0}/tasks/{config.task_id}/close", b"", token)
    assert view["rejected"] == {"mac": N}


# --- direction A: a deviating server 0 ------------------------------------------------------------------
def test_a_shifted_score_opening_of_a_calibration_report_gets_no_check_value(servers, deviant0):
    """A calibration report opens 21 elements; the attack works through any of them on which V is
    affine. Shifting d = q - a' (the score check's Beaver opening) by delta moves server 1's
    V2 by -delta b'_1, so b'_1, b' and w = f + b' = rho_alpha: alpha (positive control on the
    shifted half of the reports). The real server 1 answers message 8 with V_1 = 0 (all three) for
    every shifted report and V_1 = -V_0 for the others: nothing server 0 cannot compute itself."""
    rng = np.random.default_rng(72)  # the simulated data only
    p, y = rng.uniform(0, 1, N), rng.integers(0, 2, N)
    config, _ = task(deviant0, CGRID, p, "calibration", y)
    deviant0.reconcile(config)
    st, local, check = deviant0.state(config), deviant0.local(config), config.check()
    send, ctx, rows, delta = deviant0.send_to(config, "verify"), local.context, len(local.ids), 3
    mask = np.arange(rows) % 2 == 0
    ours = local.message.copy()
    ours[mask, 2] = F.add(ours[mask, 2], np.full(int(mask.sum()), delta, np.uint64))
    body = outcome.head(0, 1, rows, ctx) + le(ours)
    answer = st.channel.open(patiently(send, st.channel.seal(Kind.CHECK_OPEN, 0, body, ctx)), (Kind.CHECK_ANSWER,), ctx).payload
    width = 8 * check.opened * rows
    theirs, commit = elements(answer[4:4 + width], rows), answer[-32:]
    opened = F.add(ours, theirs)  # what both servers now hold: shifted where `mask`
    honest = F.add(local.message, theirs)

    # positive control: the V_1 an unprotected server 1 computes on this opening
    local1 = server_local(servers, config, 1)
    v_0 = check.round_two(0, local.state, honest, local.extras)
    v_1_shifted = check.round_two(1, local1.state, opened, local1.extras)
    b_1 = F.mul(F.neg(F.add(v_1_shifted[:, 1], v_0[:, 1])), np.full(rows, inverse(delta), np.uint64))
    w = F.add(honest[:, 3], F.add(local.extras[:, 3], b_1))  # f + b'_0 + b'_1 = sum_i rho_i D^(0)_i
    rho = round_one.challenges(check, st.pair_key, config.task_id).rho
    where = {int(x): i for i, x in enumerate(rho)}
    alphas = np.array([where.get(int(x), -1) for x in w])
    truth = config.make_grid().index(p).tolist()  # in upload order; R is in id order: compare as multisets
    assert (alphas[mask] >= 0).all(), "the positive control recovers every shifted report's alpha"
    assert all(alphas[mask].tolist().count(a) <= truth.count(a) for a in set(alphas[mask].tolist()))

    # the real server 1
    sigma_0 = check.mac_values(0, local.state, opened, local.extras)
    reply = st.channel.open(patiently(send, st.channel.seal(Kind.CHECK_MAC, 0, bytes(4) + le(sigma_0), ctx)),
                            (Kind.CHECK_MAC_OPEN,), ctx).payload
    nonce, sigma_1 = reply[4:4 + NONCE], elements(reply[4 + NONCE:4 + NONCE + width], rows)
    assert commitment(nonce, sigma_1) == commit
    v_1 = elements(reply[4 + NONCE + width:], rows)
    assert not v_1[mask].any(), "server 1 sent check values on a shifted opening"
    np.testing.assert_array_equal(v_1[~mask], F.neg(v_0[~mask]))


def test_racing_messages_to_one_step_get_one_answer_and_a_restart_keeps_the_commitment(servers, deviant0):
    """Eight different messages 5 at once: exactly one is answered, the others 409. Then server 1
    restarts between its commitment (6) and message 7: its opening (8) is what it committed to
    (its nonce and round one are rebuilt from its store, not drawn again), and eight different
    messages 7 at once again get one answer: V_1 = -V_0 if the honest 5 and 7 won, else no V_1."""
    config, _ = deviant0.task(GRID, values(N, 73) % 64, verify=True)
    deviant0.reconcile(config)
    st, local, check = deviant0.state(config), deviant0.local(config), config.check()
    send, ctx, rows = deviant0.send_to(config, "verify"), local.context, len(local.ids)
    # wait until server 1's round one is ready (a message 7 before 5: 503 while preparing, then 409)
    assert status_of(send, st.channel.seal(Kind.CHECK_MAC, 0, bytes(4) + bytes(16 * rows), ctx)) == 409

    def race(messages):
        out = [None] * len(messages)
        go = threading.Barrier(len(messages))

        def one(i):
            go.wait()
            try:
                out[i] = (200, send(messages[i]))
            except ServerError as exc:
                out[i] = (exc.status, b"")
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(messages))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    fives = [deviant0.message_5(config, local, delta=k) for k in range(8)]
    got = race(fives)
    assert sorted(s for s, _ in got) == [200] + [409] * 7, [s for s, _ in got]
    winner = next(i for i, (s, _) in enumerate(got) if s == 200)
    answer = st.channel.open(got[winner][1], (Kind.CHECK_ANSWER,), ctx).payload
    theirs, commit = elements(answer[4:-32], rows), answer[-32:]
    opened = F.add(local.message, theirs)
    opened[:, 0] = F.add(opened[:, 0], np.full(rows, winner, np.uint64))  # the opening server 1 took

    servers.restart(1)
    sevens = []
    for k in range(8):
        sigma = check.mac_values(0, local.state, opened, local.extras)
        sigma[:, 0] = F.add(sigma[:, 0], np.full(rows, k, np.uint64))  # k = 0: honest on that opening
        sevens.append(st.channel.seal(Kind.CHECK_MAC, 0, bytes(4) + le(sigma), ctx))
    assert status_of(send, deviant0.message_5(config, local, delta=99)) == 409  # ready again, and still one-shot
    got = race(sevens)
    assert sorted(s for s, _ in got) == [200] + [409] * 7, [s for s, _ in got]
    k = next(i for i, (s, _) in enumerate(got) if s == 200)
    reply = st.channel.open(got[k][1], (Kind.CHECK_MAC_OPEN,), ctx).payload
    width = 8 * check.opened * rows
    nonce, sigma_1 = reply[4:4 + NONCE], elements(reply[4 + NONCE:4 + NONCE + width], rows)
    assert commitment(nonce, sigma_1) == commit  # the committed sigma_1, after the restart
    v_1 = elements(reply[4 + NONCE + width:], rows)[:, 0]
    if winner == 0 and k == 0:  # the honest opening and MAC: V_1 = -V_0 for every report
        np.testing.assert_array_equal(v_1, F.neg(check.round_two(0, local.state, opened, local.extras)))
    else:  # a shifted opening or a wrong sigma_0: no V_1
        assert not v_1.any()


def _verified_through_values(deviant0, seed):
    """A task reconciled and checked by an honest in-process server 0 up to message 10 (every chunk's
    V_0 acknowledged), message 11 not sent: (config, state, local, the honest message 11's payload)."""
    config, _ = deviant0.task(GRID, values(N, seed) % 64, verify=True)
    deviant0.reconcile(config)
    st, local, store = deviant0.state(config), deviant0.local(config), deviant0.server.store
    verify = deviant0.send_to(config, "verify")
    verdicts = st.check_leader()._chunk(0, local.chunks()[0], 1, len(local.ids), lambda m: patiently(verify, m))
    mine = outcome.finish(store, config, 0, st.pair_key, local, verdicts)
    return config, st, local, (1).to_bytes(4, "big") + local.context + bytes.fromhex(mine)


def test_message_11_at_another_chunk_is_refused_not_answered_with_a_500(servers, deviant0):
    """Message 11 is one step (chunk 0), but `CheckHelper.answer` does not check its chunk: at chunk 1
    the channel takes it as a new step, server 1 runs its finish (exclusions under their reasons, its
    histogram share) and journals it, then fails with HTTP 500 reading chunk 0's journal row (None).
    Expected: refused (400 or 409) before anything is computed; the honest message 11 then verifies."""
    config, st, local, final = _verified_through_values(deviant0, 74)
    verify = deviant0.send_to(config, "verify")
    assert status_of(verify, st.channel.seal(Kind.CHECK_FINISH, 1, final, local.context)) in (400, 409)
    patiently(verify, st.channel.seal(Kind.CHECK_FINISH, 0, final, local.context))


def test_message_1_and_done_at_another_chunk_are_refused(servers, deviant0):
    """The same gap for the other single-message steps. Message 1 at chunk 1 (before the
    reconciliation) is answered with fresh differences over server 1's set: message 1 is asked twice.
    DONE at chunk 1 is acknowledged but does not end the exchange (`Channel.finished` looks at chunk 0
    only), so server 1 goes on answering. Expected: both refused (or DONE ending the exchange)."""
    config, _ = deviant0.task(GRID, values(N, 75) % 64, verify=True)
    st, store = deviant0.state(config), deviant0.server.store
    sync = deviant0.send_to(config, "sync")
    store.freeze(config.task_id, st.set_hash)
    ids = store.reconciled_ids(config.task_id)
    first = status_of(sync, st.channel.seal(Kind.DIGESTS, 1, reconcile.bucket_digests(st.pair_key, ids[1:])))
    st.reconciliation().run(sync)
    local = deviant0.local(config)
    verify = deviant0.send_to(config, "verify")
    st.check_leader().run(lambda m: patiently(verify, m))
    done = status_of(sync, st.channel.seal(Kind.DONE, 1, b""))
    after = status_of(verify, deviant0.message_5(config, local))  # the journalled message 5 again
    assert first in (400, 409), f"message 1 at chunk 1: HTTP {first}"
    assert done in (400, 409) or after == 409, f"DONE at chunk 1: HTTP {done}, and a replay of 5 then: HTTP {after}"
