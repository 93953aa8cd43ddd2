"""The report check at the close (`verification`'s messages 5 to 10) played by each server through
its task's `Channel`: `CheckLeader` on server 0, `CheckHelper` on server 1 (POST /tasks/{id}/verify).

Why one-shot matters here (issue 20). Server 1's answer to message 5 carries V_1 = 2e*a_1 + A_1 - L_1 +
T_1, affine in the opened e with slope 2*a_1: a server 0 that could ask twice with e_0 and e_0 + 1
would learn a_1, hence z = e + a = r_alpha, hence every client's alpha. The mirror attack: a server 1
that could answer message 5 twice with different e_1 would get V_0 twice. So each side computes its
values at most once per report: server 1 journals (request, answer) of every step before answering and
answers a step again only for the same request (`Channel.answer_once`); server 0 journals the first
valid answer to each step and never asks again (`Channel.exchange`); the check runs on one report set
R (bound into every message's associated data, and server 1 takes no reconciliation step once
reconciled), and once server 0 says DONE (or a query was answered) server 1 answers nothing more.
Server 1 keeps no state in memory: what it needs at messages 7 and 9 it reads back from its journal,
so a restart of either server replays the same messages and reaches the same verdicts.
"""
from __future__ import annotations

import hmac
from typing import Callable

import numpy as np

from fss import field as F

from .. import verification
from ..reconcile import SyncError
from ..round_one import Local
from ..store import Mark, Store
from ..task import TaskConfig
from ..verify import Check
from .channel import Channel, Kind, Message, Refused

Send = Callable[[bytes], bytes]


class CheckLeader:
    """Server 0's part: for each chunk, message 5 (its e_0, top_0) and 7 (its V_0); then 9."""

    def __init__(self, channel: Channel, store: Store, config: TaskConfig, key: bytes, local: Local):
        self.channel, self.store, self.config, self.key, self.local = channel, store, config, key, local
        self.check: Check = config.check()

    def run(self, send: Send) -> None:
        """Checks every report of R with server 1, excludes the failures and marks the task verified
        when both servers' final set hashes agree; SyncError if server 1 deviates (a different final
        set is final too: the check is never run again on new inputs)."""
        local, check, ctx = self.local, self.check, self.local.context
        chunks, n = local.chunks(), len(local.ids)
        verdicts = np.zeros(n, np.uint8)
        for c, part in enumerate(chunks):
            rows = part.stop - part.start
            ours = local.message[part]
            computed: dict[str, np.ndarray] = {}

            def fits(answer: bytes, c=c, part=part, rows=rows, ours=ours, computed=computed) -> None:
                if answer[:4] != c.to_bytes(4, "big"):
                    raise SyncError("server 1 answered another chunk of the check")
                width = 8 * check.opened * rows
                theirs, v_1 = verification.rows(answer[4:4 + width], rows, "messages"), verification.rows(answer[4 + width:], rows, "values")
                opened = F.add(ours, theirs.reshape(rows, check.opened))
                v_0 = check.round_two(0, local.state[part], opened, local.extras[part]).reshape(rows, -1)
                if v_0.shape != v_1.shape:
                    raise SyncError("server 1's check values do not fit its reports")
                computed.update(opened=opened, v_0=v_0, v_1=v_1)

            head = verification.head(c, len(chunks), n, ctx)
            answer = self.channel.exchange(Kind.CHECK_OPEN, c, head + ours.astype("<u8").tobytes(), send, fits, ctx)
            if not computed:  # journalled by an earlier run of this close: the same values from it
                fits(answer)
            verdicts[part] = verification.decide(check, computed["opened"], F.add(computed["v_0"], computed["v_1"]))
            body = c.to_bytes(4, "big") + computed["v_0"].astype("<u8").tobytes()
            self.channel.exchange(Kind.CHECK_VALUES, c, body, send, lambda ack, body=body: _acknowledged(ack, body), ctx)
        mine = verification.finish(self.store, self.config, 0, self.key, local, verdicts)
        final = len(chunks).to_bytes(4, "big") + ctx + bytes.fromhex(mine)
        theirs = self.channel.exchange(Kind.CHECK_FINISH, 0, final, send, _a_set_hash, ctx)
        if not verification.mark_if_agreed(self.store, self.config.task_id, mine, theirs.hex()):
            raise SyncError("the servers' report sets differ after the report check: the task cannot be verified")


class CheckHelper:
    """Server 1's part: answers 5, 7 and 9, each step once, from its round one over R (`local`)."""

    def __init__(self, channel: Channel, store: Store, config: TaskConfig, key: bytes, local: Local):
        self.channel, self.store, self.config, self.key, self.local = channel, store, config, key, local
        self.check: Check = config.check()
        self.chunks = local.chunks()

    @property
    def context(self) -> bytes:
        return self.local.context

    def answer(self, message: Message) -> bytes:
        """The sealed answer to message 5, 7 or 9 (`Refused` for an answered step's other content, a
        step out of phase, or anything after message 9 that is not a replay)."""
        open_steps = self.channel.answered(Kind.CHECK_FINISH, 0) is None
        if message.kind == Kind.CHECK_FINISH:
            if not all(self.channel.answered(Kind.CHECK_VALUES, c) is not None for c in range(len(self.chunks))):
                raise Refused("server 0 finished the check before every chunk was decided")
            sealed = self.channel.answer_once(message, self._finish, self.context)
            request, mine = self.channel.request(Kind.CHECK_FINISH, 0), self.channel.answered(Kind.CHECK_FINISH, 0)
            verification.mark_if_agreed(self.store, self.config.task_id, mine.hex(), request[36:].hex())
            return sealed
        if message.chunk >= len(self.chunks):
            raise SyncError("the check message names a chunk past the end")
        if message.kind == Kind.CHECK_OPEN:
            return self.channel.answer_once(message, lambda p: self._round_two(message.chunk, p), self.context, open_steps)
        if message.kind == Kind.CHECK_VALUES:
            if self.channel.answered(Kind.CHECK_OPEN, message.chunk) is None:
                raise Refused("server 0 sent its check values before its messages")
            return self.channel.answer_once(message, lambda p: self._values(message.chunk, p), self.context, open_steps)
        raise SyncError(f"the report check takes messages 5, 7 and 9, not {int(message.kind)}")

    def _part(self, c: int) -> tuple[slice, int]:
        part = self.chunks[c]
        return part, part.stop - part.start

    def _round_two(self, c: int, body: bytes) -> bytes:
        """Message 6 for chunk c: server 1's round-one messages and V_1 on the opened e."""
        local, (part, rows) = self.local, self._part(c)
        n = verification.HEAD
        if body[:n] != verification.head(c, len(self.chunks), len(local.ids), local.context):
            raise SyncError("server 0 checks another report set or chunk than server 1's")
        theirs = verification.rows(body[n:], rows, "messages")
        if theirs.shape[1] != self.check.opened:
            raise SyncError("the check message's messages do not fit its reports")
        opened = F.add(local.message[part], theirs)
        v_1 = self.check.round_two(1, local.state[part], opened, local.extras[part]).reshape(rows, -1)
        return c.to_bytes(4, "big") + local.message[part].astype("<u8").tobytes() + v_1.astype("<u8").tobytes()

    def _opened(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk c's opened round-one values and V_1, from the journalled step 5 (not from memory)."""
        local, (part, rows) = self.local, self._part(c)
        theirs = verification.rows(self.channel.request(Kind.CHECK_OPEN, c)[verification.HEAD:], rows, "messages")
        width = 8 * self.check.opened * rows
        v_1 = verification.rows(self.channel.answered(Kind.CHECK_OPEN, c)[4 + width:], rows, "values")
        return F.add(local.message[part], theirs), v_1

    def _values(self, c: int, body: bytes) -> bytes:
        """Message 8 for chunk c: its digest, once server 0's V_0 fits."""
        _, rows = self._part(c)
        if body[:4] != c.to_bytes(4, "big"):
            raise SyncError("the check message's chunk index is not its step's")
        v_0 = verification.rows(body[4:], rows, "values")
        if v_0.shape != self._opened(c)[1].shape:
            raise SyncError("the check message's values do not fit its reports")
        return verification.digest(body)

    def _verdicts(self) -> np.ndarray:
        out = []
        for c in range(len(self.chunks)):
            opened, v_1 = self._opened(c)
            v_0 = verification.rows(self.channel.request(Kind.CHECK_VALUES, c)[4:], v_1.shape[0], "values")
            out.append(verification.decide(self.check, opened, F.add(v_0, v_1)))
        return np.concatenate(out) if out else np.zeros(0, np.uint8)

    def _finish(self, body: bytes) -> bytes:
        """Message 10: server 1's set hash after excluding the failures it decided itself."""
        local = self.local
        if body[:4] != len(self.chunks).to_bytes(4, "big") or len(body) != 4 + 32 + 32 or body[4:36] != local.context:
            raise SyncError("server 0 finished a check of another report set")
        mine = verification.finish(self.store, self.config, 1, self.key, local, self._verdicts())
        return bytes.fromhex(mine)


def _acknowledged(ack: bytes, body: bytes) -> None:
    if not hmac.compare_digest(ack, verification.digest(body)):
        raise SyncError("server 1 acknowledged another chunk of the check")


def _a_set_hash(answer: bytes) -> None:
    if len(answer) != 32:
        raise SyncError("server 1's final answer is not a set hash")


def ready_mark(config: TaskConfig) -> Mark:
    """When server 1's part of a close is over: verified for a verified task, else reconciled."""
    return Mark.VERIFIED if config.verify else Mark.RECONCILED
