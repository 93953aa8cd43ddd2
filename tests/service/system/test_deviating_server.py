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
import time

import numpy as np
import pytest

from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.protocols.check import round_one, outcome
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import ServerError, http
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.protocols.channel import CHECK, Kind
from dpcdf.service.storage.store import Store
from fss import field as F
from deviating import Deviant0, Interceptor, deviant_channel, recover_alphas
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
        local1 = round_one.prepare(store1, config, 1, st.pair_key)
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
