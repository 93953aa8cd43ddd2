"""The report check at the close of a verified task (issue 12): the two servers run `verification.maths.Check`
on every reconciled report, exclude each failure (counted per reason class) identically, and keep
their share of the histogram of the reports that passed, from which every query is answered.

After the reconciliation both servers hold one report set R (its keyed hash H_R is equal on both).
Each server has evaluated every key share once over the whole grid while the reports arrived
(`round_one`: the check's round one under challenges from a key only the two servers hold, and the
sum of the grid values, its share of the histogram) and reads that back for R (`round_one.prepare`).
The messages (through the task's `protocols.channel.Channel`, bound to H_R; reports in the order of
their ids, in chunks of about MESSAGE_ELEMENTS elements; `protocols.check.exchange` plays each side):
5. server 0 -> 1: chunk c of its round-one messages (e_0, top_0), with H_R;
6. server 1 -> 0 (the answer): chunk c of its round-one messages and a commitment to its MAC values;
7. server 0 -> 1: chunk c of its MAC values sigma_0; answered by 8, the commitment's opening (sigma_1)
   and server 1's round-two values V_1 where the MAC holds (0 elsewhere);
9. server 0 -> 1: chunk c of its V_0 where the MAC holds; answered by 10, the chunk's index and digest;
11. server 0 -> 1: the keyed hash of server 0's set after the exclusions; answered by 12, server 1's.
Each server decides every report itself from the opened values (`Check.verdicts`, MAC first), so
neither has to trust the other's verdict, and each is done (Mark.VERIFIED) only when the two final
hashes are equal. Why the MAC: `protocols.check.exchange`.

Security (docs/verification.md has the proofs):
- A malicious client: a report counts only if its grid values are shares of one unit step (count),
  one unit step split as (label, 1 - label) with label in {0, 1} (label), except with probability at
  most 2/p = 2^-60 per report; its check randomness enters only a constant term, so lying about it
  gains nothing. The release is then that of the passing reports: the client can only remove its own
  report or add one honest-looking value. Keys are evaluated at grid points only and every answer
  comes from the histogram, so what a key does off the grid is never released.
- Each server learns, per report, the opened e (uniform: masked by the client's fresh a) and top and V
  (0 for an honest report): nothing about an honest value. For a failing report it learns which
  class failed; a malicious client is owed no privacy.
- The analyst learns the counts per reason class (honest reports never fail, so they depend on
  malicious clients only) and the release over the passing set.
- A server that deviates from the protocol learns nothing more: every opened element is checked
  against a MAC under the client's kappa before any V is computed on it, and every step is answered
  once (`protocols.check.exchange`, `protocols.channel`); it can drop reports at the reconciliation
  (before any value is opened), exclude reports (as "mac") or make the close fail, not learn a value.
- Re-running is safe: every step is replayed from the journals, so a close interrupted anywhere and
  run again opens the same values and reaches the same verdicts; exclusions are idempotent. Not
  covered: a server colluding with a client (it knows K).
"""
from __future__ import annotations

import hashlib
import hmac

import numpy as np

from fss import field as F

from ...storage.records import Mark
from ...storage.store import Store
from ...verification.maths import OK, REASONS
from ..context import StepContext
from ..reconciliation import maths as reconcile
from ..reconciliation.maths import SyncError
from .round_one import Local, grid_sum

HEAD = 4 + 4 + 8 + 32  # chunk index, chunk count, report count, H_R


def rows(data: bytes, count: int, what: str) -> np.ndarray:
    """A chunk's (count, k) field elements from a message (k >= 1); SyncError if they do not fit."""
    if not data or len(data) % (8 * count):
        raise SyncError(f"the check message's {what} do not fit its reports")
    arr = np.frombuffer(data, "<u8").astype(np.uint64).reshape(count, -1)
    if (arr >= np.uint64(F.P)).any():
        raise SyncError(f"the check message's {what} are not field elements")
    return arr


def head(index: int, count: int, n: int, context: bytes) -> bytes:
    """The head of a chunk of message 5: its index, the chunk count, the report count and H_R."""
    return index.to_bytes(4, "big") + count.to_bytes(4, "big") + n.to_bytes(8, "big") + context


def digest(body: bytes) -> bytes:
    """Message 8's payload: a chunk of message 7's index and SHA-256."""
    return body[:4] + hashlib.sha256(body).digest()


def finish(ctx: StepContext, local: Local, verdicts: np.ndarray) -> str:
    """Excludes every failed report under its reason class (idempotent), stores this server's
    histogram share over the passing reports (the sum over R minus the failures' values, recomputed),
    and returns the keyed hash of the passing set."""
    store, pair_key, task_id = ctx.store, ctx.pair_key, ctx.config.task_id
    verified = store.marked(task_id, Mark.VERIFIED)  # done before (a repeated close): the same verdicts, nothing to change
    frozen = store.frozen(task_id)  # the reconciled set; each exclusion below returns the set after it
    assert frozen is not None  # (closed before the check)
    if verified:
        return frozen.digest
    set_hash = lambda ids: reconcile.set_hash(pair_key, ids)  # noqa: E731
    for code, name in REASONS.items():
        ids = [local.ids[k] for k in np.flatnonzero(verdicts == code)]
        if ids:
            frozen = store.exclude(task_id, ids, set_hash, reason=name)
    histogram = F.sub(local.total, grid_sum(ctx, [local.ids[k] for k in np.flatnonzero(verdicts != OK)]))
    store.save_histogram(task_id, frozen.digest, histogram.shape, histogram.astype("<u8").tobytes())
    return frozen.digest


def mark_if_agreed(store: Store, task_id: str, mine: str, theirs: str) -> bool:
    if hmac.compare_digest(mine, theirs):
        store.mark(task_id, Mark.VERIFIED)
        return True
    return False
