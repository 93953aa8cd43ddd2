"""The reconciliation (`maths`' messages 1 to 4) played by each server through its task's
`Channel`: `ReconcileLeader` on server 0 (at the analyst's close), `ReconcileHelper` on server 1 (at
POST /tasks/{id}/sync). Both journal every step (the channel's one-shot rule), so a close run again
after a crash replays the same messages and answers, and server 1 takes no new reconciliation step once
it is reconciled: after that its report set, the set the check opens, can no longer change."""
from __future__ import annotations

import functools
from typing import Callable

from ...storage.records import AlreadyAnswered, Mark
from ..channel import Channel, Kind, Message, Refused
from ..context import StepContext
from . import maths as reconcile
from .maths import SyncError

Send = Callable[[bytes], bytes]


class _Side:
    """One server's side, on its task's context `ctx`; `on_drop` runs before its report set shrinks."""

    def __init__(self, ctx: StepContext, on_drop: Callable[[], None]):
        self.ctx, self.on_drop = ctx, on_drop
        self.channel, self.store, self.task_id, self.key = ctx.channel, ctx.store, ctx.config.task_id, ctx.pair_key

    def _exclude(self, drop: frozenset[bytes]) -> None:
        if not drop:
            return
        self.on_drop()  # loaded key shares and round-one state were of the larger set
        try:
            self.store.exclude(self.task_id, sorted(drop), lambda ids: reconcile.set_hash(self.key, ids))
        except AlreadyAnswered:
            raise Refused("the servers' report sets differ and this server has already answered: "
                          "the task cannot be reconciled") from None


class ReconcileLeader(_Side):
    """Server 0's part: message 1, then message 3 chunk by chunk from server 1's answer."""

    def run(self, send: Send, chunk_ids: int | None = None) -> None:
        """Reconciles this server's frozen set with server 1's (a no-op once done). SyncError if server
        1's answers do not open or do not fit; `Refused` if this server cannot drop any more."""
        if self.store.marked(self.task_id, Mark.RECONCILED):
            return
        ids = self.store.reconciled_ids(self.task_id)
        planned: dict[str, reconcile.Drops] = {}

        def fits(answer: bytes) -> None:  # a malformed answer is refused before it is journalled
            planned["drops"] = reconcile.drops(self.key, ids, answer, chunk_ids)

        # message 1 is over the set before this server's drops: a replay uses the journalled answer
        answer = self.channel.exchange(Kind.DIGESTS, 0, lambda: reconcile.bucket_digests(self.key, ids), send,
                                       check=fits, same=False)
        plan = planned.get("drops") or reconcile.drops(self.key, ids, answer, chunk_ids)
        self._exclude(plan.drop)
        for k, (body, ack) in enumerate(zip(plan.bodies, plan.acks)):
            self.channel.exchange(Kind.DROPS, k, body, send, check=functools.partial(reconcile.check_ack, expected=ack))
        self.store.mark(self.task_id, Mark.RECONCILED)


class ReconcileHelper(_Side):
    """Server 1's part: answers message 1 with 2 and each chunk of 3 with 4, each once."""

    def __init__(self, ctx: StepContext, on_drop: Callable[[], None], on_reconciled: Callable[[], None]):
        super().__init__(ctx, on_drop)
        self.on_reconciled = on_reconciled

    def answer(self, message: Message) -> bytes:
        """The sealed answer to message 1 or a chunk of 3 (the first closes the collection here)."""
        if message.kind not in (Kind.DIGESTS, Kind.DROPS):
            raise SyncError(f"the reconciliation takes messages 1 and 3, not {int(message.kind)}")
        self.store.freeze(self.task_id, lambda ids: reconcile.set_hash(self.key, ids))
        before = not self.store.marked(self.task_id, Mark.RECONCILED)  # after it, replays only
        ids = self.store.reconciled_ids(self.task_id)
        if message.kind == Kind.DIGESTS:
            return self.channel.answer_once(message, lambda digests: reconcile.differences(self.key, ids, digests),
                                            new_steps=before)

        def take(body: bytes) -> bytes:
            taken = reconcile.take_drops(self.key, ids, body)
            self._exclude(taken.drop)
            return taken.ack

        sealed = self.channel.answer_once(message, take, new_steps=before)
        body, ack = self.channel.request(Kind.DROPS, message.chunk), self.channel.answered(Kind.DROPS, message.chunk)
        assert body is not None and ack is not None  # (answered just now: journalled)
        if body[4:5] == b"\x01" and ack[36:] == body[5:37]:  # the last chunk, and the two sets agree: done
            self.store.mark(self.task_id, Mark.RECONCILED)
            if before:
                self.on_reconciled()
        return sealed


def finish(ctx: StepContext, message: Message, ready: Mark) -> bytes:
    """Server 1's answer to DONE: accepted once the close is over here (`ready`: reconciled, or verified
    for a verified task); from then on the channel answers nothing (`Channel.finished`)."""
    if not ctx.store.marked(ctx.config.task_id, ready):
        raise Refused(f"server 0 said the close is over before this server was {ready.value}")
    return ctx.channel.answer_once(message, lambda payload: b"")


def say_done(channel: Channel, send: Send) -> None:
    """Server 0's DONE after its close: server 1 then answers no further message. A 409 (server 1 had
    finished already, e.g. it answered a query) is as good as the acknowledgement."""
    try:
        channel.exchange(Kind.DONE, 0, b"", send)
    except Refused:
        pass
