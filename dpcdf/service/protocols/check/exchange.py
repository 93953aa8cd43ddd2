"""The report check at the close (`outcome`'s messages 5 to 12) played by each server through
its task's `Channel`: `CheckLeader` on server 0, `CheckHelper` on server 1 (POST /tasks/{id}/verify).

Why the check needs more than the sketch against a deviating server (issue 20). Server b's round-two
value V_b = [b = 0] e^2 + 2 e a_b + A_b - L_b + T_b is affine in the opened e with slope 2 a_b, and for
an honest report V_0 + V_1 = 0 at the true e, so each server can predict the other's V there. A server
that shifts its round-one share by delta (one message, not even a replay) gets V_(1-b)(e + delta) =
-V_b(e) + 2 delta a_(1-b): the other server's a share, hence z = r_alpha, hence alpha.

So no V is computed on an opened value until it is authenticated: the client also shares kappa * y
(its keys carry (beta, kappa * beta)) and kappa * x, kappa, for a uniform kappa that neither server
knows, and each server derives its share of kappa times every opened element (`verification.maths.Check.round_one`).
After the opening, sigma_b = kappa_b * opened - [kappa * opened]_b; sigma_0 + sigma_1 = kappa * shift,
which is 0 for a shift of 0 and uniform otherwise (kappa unknown): a deviating server passes with
probability 1/p. Server 1 commits to sigma_1 before it sees sigma_0 (message 6: SHA-256 of a nonce only
it can derive and sigma_1), server 0 sends sigma_0 (7), server 1 opens (8); each decides the MAC of
every report itself (`verification.maths.mac_ok`), and V is computed and sent (8, 9) only where it holds; elsewhere
the report is excluded as "mac" and 0 is sent. One-shot steps (the channel) keep each server from
being asked twice; the MAC keeps it from being asked once on a wrong input.

What a deviating server learns: for an honest report, its opened elements (uniform, masked by the
client's randomness), the other server's sigma (-sigma_b when nobody deviates; a function of kappa
shares and the shift otherwise, independent of alpha) and, where the MAC holds, V_(1-b) = -V_b. Its
deviations can exclude reports (as "mac", or by sending a wrong V), an outcome it fixes in advance
and that does not depend on any value. A client that sets kappa = 0 gives up this protection for its
own report only.

Server 1 keeps no state in memory: what it needs at messages 7, 9 and 11 it reads back from its
journal, so a restart of either server replays the same messages and reaches the same verdicts.
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Callable

import numpy as np

from fss import field as F

from ...storage.records import Mark
from ...task import TaskConfig
from ...verification.maths import Check, mac_ok
from ..channel import Kind, Message, Refused
from ..context import StepContext
from ..reconciliation.maths import SyncError
from . import outcome
from .round_one import Local

Send = Callable[[bytes], bytes]
NONCE = 32


def _le(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<u8").tobytes()


def _journalled(row: bytes | None) -> bytes:
    """The request or answer of a step this server answered (`Channel.request`, `answered`): kept."""
    assert row is not None  # (answered: journalled first)
    return row


def commitment(nonce: bytes, sigma: np.ndarray) -> bytes:
    return hashlib.sha256(b"dpcdf check commitment v1" + nonce + _le(sigma)).digest()


class CheckLeader:
    """Server 0's part (`ctx`: its context on server 0), over its round one read back for R (`local`):
    per chunk, messages 5 (e_0, top_0), 7 (sigma_0) and 9 (V_0); then 11."""

    def __init__(self, ctx: StepContext, local: Local):
        self.ctx, self.local = ctx, local
        self.channel, self.store, self.config, self.key = ctx.channel, ctx.store, ctx.config, ctx.pair_key
        self.check: Check = ctx.config.check()

    def run(self, send: Send) -> None:
        """Checks every report of R with server 1, excludes the failures and marks the task verified
        when both servers' final set hashes agree; SyncError if server 1 deviates (a different final
        set is final too: the check is never run again on new inputs)."""
        local, ctx = self.local, self.local.context
        chunks, n = local.chunks(), len(local.ids)
        verdicts = np.zeros(n, np.uint8)
        for c, part in enumerate(chunks):
            verdicts[part] = self._chunk(c, part, len(chunks), n, send)
        mine = outcome.finish(self.ctx, local, verdicts)
        final = len(chunks).to_bytes(4, "big") + ctx + bytes.fromhex(mine)
        theirs = self.channel.exchange(Kind.CHECK_FINISH, 0, final, send, _a_set_hash, ctx)
        if not outcome.mark_if_agreed(self.store, self.config.task_id, mine, theirs.hex()):
            raise SyncError("the servers' report sets differ after the report check: the task cannot be verified")

    def _chunk(self, c: int, part: slice, count: int, n: int, send: Send) -> np.ndarray:
        local, check, ctx, rows = self.local, self.check, self.local.context, part.stop - part.start
        ours, state, extras = local.message[part], local.state[part], local.extras[part]
        index = c.to_bytes(4, "big")

        def answered(answer: bytes) -> tuple[np.ndarray, bytes]:
            if answer[:4] != index or len(answer) != 4 + 8 * check.opened * rows + 32:
                raise SyncError("server 1's answer to the check does not fit the chunk")
            return outcome.rows(answer[4:-32], rows, "messages"), answer[-32:]

        answer = self.channel.exchange(Kind.CHECK_OPEN, c, outcome.head(c, count, n, ctx) + _le(ours), send,
                                       lambda a: answered(a) and None, ctx)
        theirs, commit = answered(answer)
        opened = F.add(ours, theirs)
        sigma_0 = check.mac_values(0, state, opened, extras)
        width = 8 * check.opened * rows

        def opening(reply: bytes) -> tuple[np.ndarray, np.ndarray]:
            if reply[:4] != index or len(reply) <= 4 + NONCE + width:
                raise SyncError("server 1's opening does not fit the chunk")
            nonce, sigma_1 = reply[4:4 + NONCE], outcome.rows(reply[4 + NONCE:4 + NONCE + width], rows, "MAC values")
            if not hmac.compare_digest(commitment(nonce, sigma_1), commit):
                raise SyncError("server 1's MAC values are not the ones it committed to")
            v_1 = outcome.rows(reply[4 + NONCE + width:], rows, "values")
            if v_1.shape[1] != check.check_values:  # refused before it is journalled: a retry can still succeed
                raise SyncError("server 1's check values do not fit its reports")
            return sigma_1, v_1

        reply = self.channel.exchange(Kind.CHECK_MAC, c, index + _le(sigma_0), send, lambda r: opening(r) and None, ctx)
        sigma_1, v_1 = opening(reply)
        ok = mac_ok(sigma_0, sigma_1)
        v_0 = check.round_two(0, state, opened, extras).reshape(rows, -1)
        v_0[~ok] = 0  # no value leaves this server for an opening that is not authenticated
        body = index + _le(v_0)
        self.channel.exchange(Kind.CHECK_VALUES, c, body, send, lambda ack: _acknowledged(ack, body), ctx)
        return check.verdicts(opened, _column(F.add(v_0, v_1)), ok)


class CheckHelper:
    """Server 1's part (`ctx`: its context on server 1): answers 5, 7, 9 and 11, each step once, from
    its round one over R (`local`); `secret` (known to server 1 only) derives its commitments' nonces."""

    def __init__(self, ctx: StepContext, local: Local, secret: bytes):
        self.ctx, self.local = ctx, local
        self.channel, self.store, self.config, self.key = ctx.channel, ctx.store, ctx.config, ctx.pair_key
        self.check: Check = ctx.config.check()
        self.chunks = local.chunks()
        self.secret = secret

    @property
    def context(self) -> bytes:
        return self.local.context

    def answer(self, message: Message) -> bytes:
        """The sealed answer to message 5, 7, 9 or 11 (`Refused` for an answered step's other content,
        a step out of phase, or a new step after message 11)."""
        open_steps = self.channel.answered(Kind.CHECK_FINISH, 0) is None
        if message.kind == Kind.CHECK_FINISH:
            if not all(self.channel.answered(Kind.CHECK_VALUES, c) is not None for c in range(len(self.chunks))):
                raise Refused("server 0 finished the check before every chunk was decided")
            sealed = self.channel.answer_once(message, self._finish, self.context)
            request, mine = (_journalled(self.channel.request(Kind.CHECK_FINISH, 0)),
                             _journalled(self.channel.answered(Kind.CHECK_FINISH, 0)))
            outcome.mark_if_agreed(self.store, self.config.task_id, mine.hex(), request[36:].hex())
            return sealed
        c = message.chunk
        if c >= len(self.chunks):
            raise SyncError("the check message names a chunk past the end")
        before = {Kind.CHECK_OPEN: None, Kind.CHECK_MAC: Kind.CHECK_OPEN, Kind.CHECK_VALUES: Kind.CHECK_MAC}
        if message.kind not in before:
            raise SyncError(f"the report check takes messages 5, 7, 9 and 11, not {int(message.kind)}")
        prior = before[message.kind]
        if prior is not None and self.channel.answered(prior, c) is None:
            raise Refused(f"server 0 sent message {int(message.kind)} of chunk {c} before message {int(prior)}")
        step = {Kind.CHECK_OPEN: self._commit, Kind.CHECK_MAC: self._open, Kind.CHECK_VALUES: self._values}[message.kind]
        return self.channel.answer_once(message, lambda body: step(c, body), self.context, open_steps)

    # --- each step, from the journal ----------------------------------------------------------------
    def _part(self, c: int) -> tuple[slice, int]:
        part = self.chunks[c]
        return part, part.stop - part.start

    def _nonce(self, c: int) -> bytes:
        return hmac.new(self.secret, b"check nonce" + c.to_bytes(4, "big") + self.context, hashlib.sha256).digest()

    def _opened(self, c: int, body: bytes | None = None) -> np.ndarray:
        """Chunk c's opened round-one elements (from message 5: `body`, else the journalled one)."""
        local, (part, rows) = self.local, self._part(c)
        body = _journalled(self.channel.request(Kind.CHECK_OPEN, c)) if body is None else body
        theirs = outcome.rows(body[outcome.HEAD:], rows, "messages")
        if theirs.shape[1] != self.check.opened:
            raise SyncError("the check message's messages do not fit its reports")
        return F.add(local.message[part], theirs)

    def _sigma(self, c: int, opened: np.ndarray) -> np.ndarray:
        part, _ = self._part(c)
        return self.check.mac_values(1, self.local.state[part], opened, self.local.extras[part])

    def _commit(self, c: int, body: bytes) -> bytes:
        """Message 6: server 1's round-one messages and its commitment to sigma_1."""
        local, (part, _) = self.local, self._part(c)
        if body[:outcome.HEAD] != outcome.head(c, len(self.chunks), len(local.ids), local.context):
            raise SyncError("server 0 checks another report set or chunk than server 1's")
        sigma_1 = self._sigma(c, self._opened(c, body))
        return c.to_bytes(4, "big") + _le(local.message[part]) + commitment(self._nonce(c), sigma_1)

    def _mac(self, c: int, body: bytes | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(opened, sigma_1, whether each report's MAC holds) of chunk c, from message 7 (`body`, else
        the journalled one)."""
        _, rows = self._part(c)
        body = _journalled(self.channel.request(Kind.CHECK_MAC, c)) if body is None else body
        if body[:4] != c.to_bytes(4, "big"):
            raise SyncError("the check message's chunk index is not its step's")
        sigma_0 = outcome.rows(body[4:], rows, "MAC values")
        if sigma_0.shape[1] != self.check.opened:
            raise SyncError("the check message's MAC values do not fit its reports")
        opened = self._opened(c)
        sigma_1 = self._sigma(c, opened)
        return opened, sigma_1, mac_ok(sigma_0, sigma_1)

    def _open(self, c: int, body: bytes) -> bytes:
        """Message 8: the opening of the commitment, and V_1 where the MAC holds (0 elsewhere)."""
        part, rows = self._part(c)
        opened, sigma_1, ok = self._mac(c, body)
        v_1 = self.check.round_two(1, self.local.state[part], opened, self.local.extras[part]).reshape(rows, -1)
        v_1[~ok] = 0  # no value leaves this server for an opening that is not authenticated
        return c.to_bytes(4, "big") + self._nonce(c) + _le(sigma_1) + _le(v_1)

    def _values(self, c: int, body: bytes) -> bytes:
        """Message 10 for chunk c: its digest, once server 0's V_0 fits."""
        _, rows = self._part(c)
        if body[:4] != c.to_bytes(4, "big"):
            raise SyncError("the check message's chunk index is not its step's")
        v_0 = outcome.rows(body[4:], rows, "values")
        if v_0.shape[1] != self.check.check_values:
            raise SyncError("the check message's values do not fit its reports")
        return outcome.digest(body)

    def _verdicts(self) -> np.ndarray:
        out = []
        for c in range(len(self.chunks)):
            _, rows = self._part(c)
            opened, sigma_1, ok = self._mac(c)
            width = 8 * self.check.opened * rows
            v_1 = outcome.rows(_journalled(self.channel.answered(Kind.CHECK_MAC, c))[4 + NONCE + width:], rows, "values")
            v_0 = outcome.rows(_journalled(self.channel.request(Kind.CHECK_VALUES, c))[4:], rows, "values")
            out.append(self.check.verdicts(opened, _column(F.add(v_0, v_1)), ok))
        return np.concatenate(out) if out else np.zeros(0, np.uint8)

    def _finish(self, body: bytes) -> bytes:
        """Message 12: server 1's set hash after excluding the failures it decided itself."""
        local = self.local
        if body[:4] != len(self.chunks).to_bytes(4, "big") or len(body) != 4 + 32 + 32 or body[4:36] != local.context:
            raise SyncError("server 0 finished a check of another report set")
        return bytes.fromhex(outcome.finish(self.ctx, local, self._verdicts()))


def _column(v: np.ndarray) -> np.ndarray:
    """One check value per report as (n,), several as (n, k): what `Check.verdicts` takes."""
    return v[:, 0] if v.shape[1] == 1 else v


def _acknowledged(ack: bytes, body: bytes) -> None:
    if not hmac.compare_digest(ack, outcome.digest(body)):
        raise SyncError("server 1 acknowledged another chunk of the check")


def _a_set_hash(answer: bytes) -> None:
    if len(answer) != 32:
        raise SyncError("server 1's final answer is not a set hash")


def ready_mark(config: TaskConfig) -> Mark:
    """When server 1's part of a close is over: verified for a verified task, else reconciled."""
    return Mark.VERIFIED if config.verify else Mark.RECONCILED
