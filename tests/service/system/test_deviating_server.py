"""A server that deviates from the protocol (issue 20), against real server processes: re-sent,
altered, reordered, truncated and out-of-phase messages at every step of the reconciliation and the
report check, in both directions, after the task is verified and after a restart of either side.

What each test states: the deviating server learns nothing beyond its own shares and the protocol's
outputs. Concretely: server 1 answers each step once (the same request gets the same answer, other
content a 409 that carries no answer), and server 0 asks each step once (it never computes its check
values on a second input from server 1). The review's two-message attack (docs/verification.md §
A deviating server) recovers every alpha from two answers; the tests show the second is never given."""
from __future__ import annotations

import os
import secrets
import signal
import threading
import time

import numpy as np
import pytest

from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.protocols.check import round_one, outcome
from dpcdf.service.verification import randomness as RND
from dpcdf.service.protocols.check.exchange import NONCE, commitment
from dpcdf.service.protocols.reconciliation import maths as reconcile
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.client import create_task, make_reports, submit
from dpcdf.service.hpke import ServerKeys
from dpcdf.service.http import ServerError, fetch, http
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.protocols.channel import CHECK, Kind
from dpcdf.service.server.state import pair_key
from dpcdf.service.protocols.context import StepContext
from dpcdf.service.storage.store import Store
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.service.wire import encode_batch
from fss import field as F
from deviating import OCTETS, Deviant0, Interceptor, deviant_channel, operator, recover_alphas
from helpers import TESTING, values

GRID = {"kind": "uniform", "lo": 0.0, "hi": 64.0, "bits": 6}
N = 24


class Servers:
    """A real server 0, a real server 1 on a fixed port (it restarts at the same URL) and an
    interceptor before server 1 (the deviating server 1 of direction B)."""

    def __init__(self, base):
        self.base, self.port1 = base, free_port()
        self.p0, self.url0 = self._start(0)
        self.p1, self.url1 = self._start(1, self.port1)
        self.interceptor = Interceptor(self.url1)

    def _start(self, party, port=None):
        return start_server(party, str(self.base / f"s{party}"), port=port, noise=False, extra_env=TESTING)

    def restart(self, party):
        proc = self.p0 if party == 0 else self.p1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if party == 0:
            self.p0, self.url0 = start_server(0, str(self.base / "s0"), port=int(self.url0.rsplit(":", 1)[1]),
                                              noise=False, extra_env=TESTING)
        else:
            self.p1, _ = self._start(1, self.port1)

    def close(self):
        self.interceptor.close()
        for p in (self.p0, self.p1):
            if p.poll() is None:
                stop(p)


@pytest.fixture(scope="session")
def servers(tmp_path_factory):
    s = Servers(tmp_path_factory.mktemp("deviating"))
    yield s
    s.close()


@pytest.fixture
def deviant0(servers, tmp_path):
    """Server 0 played by the test against the real server 1."""
    d = Deviant0(tmp_path / "deviant0", servers.url1)
    yield d
    d.close()


@pytest.fixture
def interceptor(servers):
    servers.interceptor.rewrite = servers.interceptor.refuse = None
    servers.interceptor.log.clear()
    yield servers.interceptor
    servers.interceptor.rewrite = servers.interceptor.refuse = None


def patiently(send, message: bytes) -> bytes:
    """A check message, sent again while server 1 answers 503 (its round one is still running)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return send(message)
        except ServerError as exc:
            if exc.status != 503 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def refused(send, message: bytes, status: int, match: str = "") -> None:
    with pytest.raises(ServerError, match=f"HTTP {status} {match}") as exc:
        patiently(send, message)
    assert exc.value.status == status


def bump(payload: bytes, at: int) -> bytes:
    """The payload with the field element at byte offset `at` plus one (still a field element)."""
    x = int.from_bytes(payload[at:at + 8], "little")
    return payload[:at] + ((x + 1) % F.P).to_bytes(8, "little") + payload[at + 8:]


# --- direction A: a deviating server 0 against a real server 1 ---------------------------------------
def test_a_shifted_opening_gets_no_check_value_and_a_second_one_no_answer(servers, deviant0):
    """The attack: server 0 sends message 5 with e_0 + 1 (one message). Positive control: with the V_1
    an unprotected server 1 computes there (here from its own stored state), `recover_alphas` recovers
    every report's exact grid index. The real server 1 answers message 5 (its e_1 and a commitment),
    but its MAC fails for every report, so its message 8 carries no V_1 (zeros) and the attack
    recovers nothing; message 5 again with another e_0 is refused (409, no answer bytes), before and
    after a restart, and the first message again gets the same answer."""
    vals = values(N, 31) % 64
    config, _ = deviant0.task(GRID, vals, verify=True)
    deviant0.reconcile(config)
    st, local, check = deviant0.state(config), deviant0.local(config), config.check()
    send, ctx, rows = deviant0.send_to(config, "verify"), local.context, len(local.ids)
    assert len(local.chunks()) == 1
    answer = st.channel.open(patiently(send, deviant0.message_5(config, local, delta=1)), (Kind.CHECK_ANSWER,), ctx).payload
    msg_1 = np.frombuffer(answer[4:4 + 8 * check.opened * rows], "<u8").astype(np.uint64).reshape(rows, check.opened)

    # the positive control: what a server 1 without the MAC would send at e + 1, from its own state
    store1 = Store(servers.base / "s1" / "server.sqlite")
    try:
        local1 = round_one.prepare(StepContext.of(config, 1, store1, st.pair_key))
    finally:
        store1.close()
    honest = F.add(local.message, msg_1)
    shifted = honest.copy()
    shifted[:, 0] = F.add(shifted[:, 0], np.ones(rows, np.uint64))
    v_1_shifted = check.round_two(1, local1.state, shifted, local1.extras)
    v_0 = check.round_two(0, local.state, honest, local.extras)
    truth = np.sort(config.make_grid().index(vals))
    np.testing.assert_array_equal(np.sort(recover_alphas(config, st.pair_key, local, msg_1[:, 0], v_1_shifted, v_0, 1)), truth)

    # the real server 1: the MAC of every shifted opening fails, and no V_1 leaves it
    reply = st.channel.open(patiently(send, deviant0.message_7(config, local, shifted)), (Kind.CHECK_MAC_OPEN,), ctx).payload
    width = 8 * check.opened * rows
    v_1 = np.frombuffer(reply[4 + 32 + width:], "<u8").astype(np.uint64)
    assert not v_1.any()
    assert (recover_alphas(config, st.pair_key, local, msg_1[:, 0], v_1, v_0, 1) != truth).all()
    for restart in (False, True):
        if restart:
            servers.restart(1)
        refused(send, deviant0.message_5(config, local, delta=2), 409, "step 5/0 was answered for another message")
        refused(send, deviant0.message_5(config, local), 409, "step 5/0 was answered for another message")
        again = st.channel.open(patiently(send, deviant0.message_5(config, local, delta=1)), (Kind.CHECK_ANSWER,), ctx).payload
        assert again == answer


def test_an_honest_check_between_a_real_and_an_in_process_server_passes_every_report(servers, deviant0):
    """The control for the MAC: when server 0 follows the protocol, every report's MAC holds and
    every honest report counts (server 1 marks the task verified with no rejection)."""
    config, token = deviant0.task(GRID, values(N, 36) % 64, verify=True)
    deviant0.reconcile(config)
    st = deviant0.state(config)
    st.check_leader().run(lambda m: patiently(deviant0.send_to(config, "verify"), m))
    from dpcdf.service.protocols.reconciliation.exchange import say_done
    say_done(st.channel, deviant0.send_to(config, "sync"))
    view = http("POST", f"{servers.url1}/tasks/{config.task_id}/close", b"", token)
    assert view["reconciled"] and view["rejected"] == {} and view["n"] == N


def test_every_check_step_is_answered_once_in_order_and_nothing_after_the_close(servers, deviant0):
    """Out of phase (7 or 9 before 5), truncated, bound to another report set or past the last chunk:
    refused, nothing answered. Then the honest check runs; altered 5, 7 and 9 are refused; honest
    replays get the journalled answers; after DONE, every captured message of both protocols is 409."""
    config, _ = deviant0.task(GRID, values(N, 32) % 64, verify=True)
    captured = {"sync": [], "verify": []}

    def capture(path):
        send = deviant0.send_to(config, path)

        def go(message):
            captured[path].append(message)
            return patiently(send, message)
        return go

    st = deviant0.state(config)
    deviant0.server.store.freeze(config.task_id, st.set_hash)
    st.reconciliation().run(capture("sync"))
    local, ctx, verify = deviant0.local(config), deviant0.local(config).context, deviant0.send_to(config, "verify")
    rows = len(local.ids)
    refused(verify, st.channel.seal(Kind.CHECK_MAC, 0, bytes(4) + bytes(16 * rows), ctx), 409, "server 0 sent message 7 of chunk 0 before message 5")
    refused(verify, st.channel.seal(Kind.CHECK_VALUES, 0, bytes(4) + bytes(8 * rows), ctx), 409, "server 0 sent message 9 of chunk 0 before message 7")
    refused(verify, st.channel.seal(Kind.CHECK_FINISH, 0, bytes(68), ctx), 409, "server 0 finished the check before")
    refused(verify, deviant0.message_5(config, local)[:30], 400)
    refused(verify, st.channel.seal(Kind.CHECK_OPEN, 0, deviant0.message_5(config, local)[5:], secrets.token_bytes(32)), 400)
    refused(verify, st.channel.seal(Kind.CHECK_OPEN, 7, b"x" * 64, ctx), 400, "the check message names a chunk past the end")
    refused(verify, st.channel.seal(Kind.DIGESTS, 0, b"", ctx), 400)  # a sync kind at /verify

    st.check_leader().run(capture("verify"))
    assert deviant0.server.store.marked(config.task_id, "verified")
    sent = [st.channel.open(m, CHECK, ctx) for m in captured["verify"]]
    assert [int(m.kind) for m in sent] == [5, 7, 9, 11]
    for m, at in zip(sent, (outcome.HEAD, 4, 4, None)):  # e_0, sigma_0, V_0, the final hash: each changed
        altered = m.payload[:36] + secrets.token_bytes(32) if at is None else bump(m.payload, at)
        refused(verify, st.channel.seal(m.kind, m.chunk, altered, ctx), 409, f"step {int(m.kind)}/0 was answered")
    for raw in captured["verify"]:  # replays before DONE: the journalled answers, nothing new
        assert patiently(verify, raw)[:5] == bytes([int(raw[0]) + 1]) + raw[1:5]

    from dpcdf.service.protocols.reconciliation.exchange import say_done
    say_done(st.channel, deviant0.send_to(config, "sync"))
    for path, messages in captured.items():
        for raw in messages:
            refused(deviant0.send_to(config, path), raw, 409, "this task's exchange between the servers is finished")
    refused(verify, deviant0.message_5(config, local, delta=5), 409, "this task's exchange")


def test_server_1_takes_no_reconciliation_step_once_reconciled(servers, deviant0):
    """The way around the check's one-shot rule would be a new report set: after server 1 is
    reconciled, a new chunk of message 3 (dropping a report), other digests, and a chunk altered
    are refused; the honest chunk again gets the same acknowledgement; server 1's set is unchanged."""
    from dpcdf.service.protocols.reconciliation import maths as reconcile

    config, token = deviant0.task(GRID, values(N, 33) % 64, verify=False)
    st = deviant0.state(config)
    sync = deviant0.send_to(config, "sync")
    sent = []
    deviant0.server.store.freeze(config.task_id, st.set_hash)
    st.reconciliation().run(lambda m: sent.append(m) or sync(m))
    assert [m[0] for m in sent] == [1, 3]
    ids = deviant0.server.store.reconciled_ids(config.task_id)
    body = st.channel.open(sent[1], (Kind.DROPS,)).payload
    drop_one = (1).to_bytes(4, "big") + b"\x01" + bytes.fromhex(reconcile.set_hash(st.pair_key, ids[1:])) + ids[0]
    refused(sync, st.channel.seal(Kind.DROPS, 1, drop_one), 409, "step 3/1 comes too late")
    refused(sync, st.channel.seal(Kind.DROPS, 0, body + ids[0]), 409, "step 3/0 was answered")
    refused(sync, st.channel.seal(Kind.DIGESTS, 0, reconcile.bucket_digests(st.pair_key, ids[1:])), 409, "step 1/0 was answered")
    ack = st.channel.open(sync(sent[1]), (Kind.DROPS_ACK,)).payload
    assert ack == reconcile.take_drops(st.pair_key, ids, body).ack
    view = http("GET", f"{servers.url1}/tasks/{config.task_id}", token=token)
    assert view["reports"] == N  # nothing dropped by the refused steps


# --- direction B: a deviating server 1 against a real server 0 ---------------------------------------
def _verified_task(servers, interceptor, seed):
    config, token = create_task([servers.url0, interceptor.url], GRID, 1.0, "tree", "substitution", min_batch=0)
    assert config.verify
    vals = values(N, seed) % 64
    submit(config, vals, batch=N)
    return config, token, vals


def _kinds(interceptor, path):
    """The kinds of the messages to `path` that server 1 answered (not the 503s while it prepares)."""
    return [body[0] for p, body, status, _ in interceptor.log if p.endswith(path) and status != 503]


def test_a_deviating_server_1_gets_server_0s_check_values_once_whatever_it_answers(servers, interceptor):
    """The mirror attack: server 1 fails message 9, the analyst closes again (and server 0 restarts in
    between), and server 1 would now answer message 5 with another e_1 to get V_0 on a second input.
    Server 0 never sends message 5 again: it uses the answer it journalled, sends the same V_0, and the
    close ends with the exact counts."""
    config, token, vals = _verified_task(servers, interceptor, 34)
    ch1 = deviant_channel(config, 1, servers.base / "s1")
    fail = {"finish": True}

    def refuse(path, body):
        if path.endswith("/verify") and body[:1] == bytes([Kind.CHECK_FINISH]) and fail.pop("finish", False):
            return 502
        return None

    def rewrite(path, body, status, answer):  # a second message 5 would get a different (valid) e_1
        if path.endswith("/verify") and body[:1] == bytes([Kind.CHECK_OPEN]) and _kinds(interceptor, "/verify").count(5):
            m = ch1.open(answer, (Kind.CHECK_ANSWER,), ch1_context(config, servers))
            return 200, ch1.seal(Kind.CHECK_ANSWER, m.chunk, bump(m.payload, 4), ch1_context(config, servers))
        return None

    interceptor.refuse, interceptor.rewrite = refuse, rewrite
    analyst = Analyst(config, token)
    with pytest.raises(ServerError, match="502"):
        analyst.close()
    servers.restart(0)
    assert analyst.close() == N
    kinds = _kinds(interceptor, "/verify")
    assert [kinds.count(k) for k in (5, 7, 9, 11)] == [1, 1, 1, 2], kinds  # only 11 sent again, after the 502
    values_sent = {body for p, body, _, _ in interceptor.log if p.endswith("/verify") and body[0] == Kind.CHECK_VALUES}
    opened = {ch1.open(b, (Kind.CHECK_VALUES,), ch1_context(config, servers)).payload for b in values_sent}
    assert len(opened) == 1  # one V_0, on one input
    counts, n = analyst.prefix_counts(range(64))
    assert n == N
    np.testing.assert_array_equal(counts, prefix_counts(vals, config.make_grid()))


def ch1_context(config, servers) -> bytes:
    store = Store(servers.base / "s1" / "server.sqlite")
    try:
        from dpcdf.service.protocols.reconciliation import maths as reconcile
        from dpcdf.service.hpke import ServerKeys
        from dpcdf.service.server.state import pair_key

        key = pair_key(config, 1, ServerKeys(servers.base / "s1"))
        return bytes.fromhex(reconcile.set_hash(key, store.reconciled_ids(config.task_id)))
    finally:
        store.close()


def test_a_malformed_or_foreign_answer_from_server_1_is_not_taken_and_the_close_recovers(servers, interceptor):
    """Server 1 answers message 5 with a truncated, then with another chunk's, answer: server 0 refuses
    each (502) and journals nothing, so nothing it computed from them left it (no message 7 or 9); the honest
    answer then completes the close. Server 1 also answers message 1 with 502 once: server 0 sends its
    digests again (nothing was journalled), and message 1 is answered once by the real server."""
    config, token, vals = _verified_task(servers, interceptor, 35)
    ch1 = deviant_channel(config, 1, servers.base / "s1")
    plan = ["sync-fail", "truncated", "other-chunk"]

    def refuse(path, body):
        if path.endswith("/sync") and body[0] == Kind.DIGESTS and plan and plan[0] == "sync-fail":
            plan.pop(0)
            return 502
        return None

    def rewrite(path, body, status, answer):
        if not (path.endswith("/verify") and body[0] == Kind.CHECK_OPEN and status == 200 and plan):
            return None
        ctx = ch1_context(config, servers)
        m = ch1.open(answer, (Kind.CHECK_ANSWER,), ctx)
        how = plan.pop(0)
        if how == "truncated":
            return 200, ch1.seal(Kind.CHECK_ANSWER, m.chunk, m.payload[:-8], ctx)
        return 200, ch1.seal(Kind.CHECK_ANSWER, m.chunk + 1, m.payload, ctx)

    interceptor.refuse, interceptor.rewrite = refuse, rewrite
    analyst = Analyst(config, token)
    for _ in range(3):
        with pytest.raises(ServerError, match="502"):
            analyst.close()
        assert not {7, 9} & set(_kinds(interceptor, "/verify"))  # nothing computed on a refused answer
    assert analyst.close() == N
    assert [_kinds(interceptor, "/verify").count(k) for k in (7, 9)] == [1, 1]
    counts, _ = analyst.prefix_counts(range(64))
    np.testing.assert_array_equal(counts, prefix_counts(vals, config.make_grid()))


@pytest.mark.parametrize("kind", [Kind.DIGESTS, Kind.DROPS, Kind.CHECK_MAC, Kind.CHECK_VALUES])
def test_an_altered_answer_from_server_1_is_refused_and_the_close_recovers(servers, interceptor, kind):
    """Server 1 answers one step with altered content, correctly sealed (its differences with a bucket
    flipped, an acknowledgement of other bytes, an opening that is not what it committed to, an ack of
    other values): server 0 refuses it (502), journals nothing, and sends nothing computed from it; the
    close run again gets the real answer and ends with the exact counts, each value sent once."""
    config, token, vals = _verified_task(servers, interceptor, 40 + int(kind))
    ch1 = deviant_channel(config, 1, servers.base / "s1")
    left = {"once": True}

    def rewrite(path, body, status, answer):
        if status != 200 or body[:1] != bytes([kind]) or not left.pop("once", False):
            return None
        ctx = ch1_context(config, servers) if kind >= Kind.CHECK_OPEN else b""
        m = ch1.open(answer, (Kind(kind + 1),), ctx)
        at = {Kind.DIGESTS: 0, Kind.DROPS: 8, Kind.CHECK_MAC: 4 + 32, Kind.CHECK_VALUES: 8}[kind]
        altered = m.payload[:at] + bytes([m.payload[at] ^ 1]) + m.payload[at + 1:]
        return 200, ch1.seal(Kind(kind + 1), m.chunk, altered, ctx)

    interceptor.rewrite = rewrite
    analyst = Analyst(config, token)
    with pytest.raises(ServerError, match="502"):
        analyst.close()
    assert not left
    assert analyst.close() == N
    kinds = _kinds(interceptor, "/verify")
    assert [kinds.count(k) for k in (5, 11)] == [1, 1]  # message 5 and the finish: once each
    counts, _ = analyst.prefix_counts(range(64))
    np.testing.assert_array_equal(counts, prefix_counts(vals, config.make_grid()))


def test_a_wrong_final_hash_from_server_1_leaves_the_task_unverified_for_good(servers, interceptor):
    """Server 1 answers message 11 with another set hash: server 0 is not verified, and closing again
    replays the journalled answer (the check is never run again on new inputs): still 502, no answer."""
    config, token, _ = _verified_task(servers, interceptor, 47)
    ch1 = deviant_channel(config, 1, servers.base / "s1")

    def rewrite(path, body, status, answer):
        if status == 200 and body[:1] == bytes([Kind.CHECK_FINISH]):
            ctx = ch1_context(config, servers)
            ch1.open(answer, (Kind.CHECK_FINAL,), ctx)  # the real answer, replaced by another hash
            return 200, ch1.seal(Kind.CHECK_FINAL, 0, secrets.token_bytes(32), ctx)
        return None

    interceptor.rewrite = rewrite
    analyst = Analyst(config, token)
    for _ in range(2):
        with pytest.raises(ServerError, match="502 .*cannot be verified"):
            analyst.close()
    assert _kinds(interceptor, "/verify").count(Kind.CHECK_FINISH) == 1
    with pytest.raises(ServerError, match="409"):
        http("POST", f"{servers.url0}/tasks/{config.task_id}/query", b'{"kind": "prefix", "indices": [3]}', token)


# ==================================================================================================
# Independent review of issue 20 (a server that deviates from the protocol), on real server processes.
#
# What these tests add to the tests above:
# - the mirror of the one-message attack, run by a deviating server 1 on a real server 0: it shifts its
#   e_1 in message 6 and opens a commitment consistent with the shifted opening; a positive control
#   recovers every alpha from the V_0 an unprotected server 0 would send, and the real one sends none;
# - the attack on a calibration task through another opened element (d = q - a', the score check's
#   Beaver opening): with V_1 at d + delta, b'_1 and hence w = rho_alpha fall out (positive control);
#   the real server 1 sends no V for a shifted report and -V_0 for the others;
# - racing messages to one step (only one answered, the rest 409), and a restart of server 1 between
#   its commitment (6) and its opening (8): the opening is the committed one;
# - single-message steps (11, 13, 1) at a chunk other than 0 (its findings, fixed: message 11 at
#   chunk 1 answered 500 after running server 1's finish, message 1 could be asked again at another
#   chunk, DONE at chunk 1 was acknowledged without ending the exchange; now the channel opens the
#   single-message kinds at chunk 0 only). A third finding, fixed: server 0 journalled message 8 before
#   checking V_1's width, so a malformed one stuck the close for good.
#
# Each test shares the server processes above (one pair, the session-scoped `servers` of this file).
# (moved from tests/service/test_deviating_server_review.py)
# ==================================================================================================
CGRID = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 5}
N_REVIEW = 16  # the review's tests: 16 reports (the tests above: N = 24)


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
        return round_one.prepare(StepContext.of(config, party, store, pair_key(config, party, ServerKeys(data))))
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
    vals = values(N_REVIEW, 71) % 64
    submit(config, vals, batch=N_REVIEW)
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
            ctx, rows = seen["local1"].context, N_REVIEW
            m = ch1.open(answer, (Kind.CHECK_MAC_OPEN,), ctx).payload
            v_1 = check.round_two(1, seen["local1"].state, seen["opened"], seen["local1"].extras)  # as if it passed
            return 200, ch1.seal(Kind.CHECK_MAC_OPEN, 0, m[:4] + seen["opening"] + le(v_1), ctx)
        if body[0] == Kind.CHECK_VALUES:
            seen["v_0"] = elements(ch1.open(body, (Kind.CHECK_VALUES,), seen["local1"].context).payload[4:], N_REVIEW)[:, 0]
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
        num = F.sub(F.add(v_0_shifted, v_1), F.add(F.mul(e, np.full(N_REVIEW, 2 * delta, np.uint64)),
                                                   np.full(N_REVIEW, delta * delta, np.uint64)))
        a_0 = F.mul(num, np.full(N_REVIEW, inverse(2 * delta), np.uint64))
        z = F.add(F.add(seen["e_0"][:, 0], a_0), F.add(local1.message[:, 0], local1.extras[:, 0]))
        r, _ = RND.challenges(round_one.verification_key(key1), b"dpcdf round one/" + config.task_id.encode(),
                            config.make_grid().size)
        where = {int(x): i for i, x in enumerate(r)}
        return np.array([where.get(int(x), -1) for x in z])

    shifted = seen["opened"].copy()
    shifted[:, 0] = F.add(shifted[:, 0], np.full(N_REVIEW, delta, np.uint64))
    unprotected = check.round_two(0, local0.state, shifted, local0.extras)
    np.testing.assert_array_equal(np.sort(recover(unprotected)), truth)  # the attack works on the arithmetic
    assert not seen["v_0"].any(), "server 0 sent check values on an opening whose MAC failed"
    assert (np.sort(recover(seen["v_0"])) != truth).any()
    view = http("POST", f"{servers.url0}/tasks/{config.task_id}/close", b"", token)
    assert view["rejected"] == {"mac": N_REVIEW}


# --- direction A: a deviating server 0 ------------------------------------------------------------------
def test_a_shifted_score_opening_of_a_calibration_report_gets_no_check_value(servers, deviant0):
    """A calibration report opens 21 elements; the attack works through any of them on which V is
    affine. Shifting d = q - a' (the score check's Beaver opening) by delta moves server 1's
    V2 by -delta b'_1, so b'_1, b' and w = f + b' = rho_alpha: alpha (positive control on the
    shifted half of the reports). The real server 1 answers message 8 with V_1 = 0 (all three) for
    every shifted report and V_1 = -V_0 for the others: nothing server 0 cannot compute itself."""
    rng = np.random.default_rng(72)  # the simulated data only
    p, y = rng.uniform(0, 1, N_REVIEW), rng.integers(0, 2, N_REVIEW)
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
    config, _ = deviant0.task(GRID, values(N_REVIEW, 73) % 64, verify=True)
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
    config, _ = deviant0.task(GRID, values(N_REVIEW, seed) % 64, verify=True)
    deviant0.reconcile(config)
    st, local = deviant0.state(config), deviant0.local(config)
    verify = deviant0.send_to(config, "verify")
    verdicts = st.check_leader()._chunk(0, local.chunks()[0], 1, len(local.ids), lambda m: patiently(verify, m))
    mine = outcome.finish(st.ctx, local, verdicts)
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
    config, _ = deviant0.task(GRID, values(N_REVIEW, 75) % 64, verify=True)
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
