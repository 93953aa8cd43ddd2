"""The report check at the close of a verified task (issue 12): the two servers run `verify.Check`
on every reconciled report, exclude each failure (counted per reason class) identically, and keep
their share of the histogram of the reports that passed, from which every query is answered.

After the reconciliation both servers hold one report set R (its keyed hash H_R is equal on both).
Each server has evaluated every key share once over the whole grid while the reports arrived
(`round_one`: the check's round one under challenges from a key only the two servers hold, and the
sum of the grid values, its share of the histogram) and reads that back for R (`round_one.prepare`).
The messages (AES-GCM under K, as
`reconcile`'s; reports in the order of their ids, in chunks of about MESSAGE_ELEMENTS elements):
5. server 0 -> 1: chunk c of its round-one messages (e_0, top_0), with H_R;
6. server 1 -> 0 (the answer): chunk c of its round-one messages and its round-two values V_1;
7. server 0 -> 1: chunk c of its V_0; answered by 8, the chunk's index and digest;
9. server 0 -> 1: the keyed hash of server 0's set after the exclusions; answered by 10, server 1's.
Each server decides every report itself from the opened values (`Check.verdicts`), so neither has to
trust the other's verdict, and each is done (Mark.VERIFIED) only when the two final hashes are equal.

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
- Re-running is safe: everything is a deterministic function of R, the stored shares and K, so a
  close interrupted anywhere and run again opens the same values and reaches the same verdicts;
  exclusions are idempotent. Not covered: a server colluding with a client (it knows K), servers that
  deviate from the protocol (they could drop reports at the reconciliation anyway).
"""
from __future__ import annotations

import hashlib
import hmac
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fss import field as F

from . import reconcile
from .reconcile import SyncError, open_sealed, seal
from .round_one import Local, grid_sum
from .store import Mark, Store
from .task import TaskConfig
from .verify import OK, REASONS, Check

_HEAD = 4 + 4 + 8 + 32  # chunk index, chunk count, report count, H_R


def _rows(data: bytes, rows: int, what: str) -> np.ndarray:
    """A chunk's (rows, k) field elements from a message (k >= 1); SyncError if they do not fit."""
    if not data or len(data) % (8 * rows):
        raise SyncError(f"the check message's {what} do not fit its reports")
    arr = np.frombuffer(data, "<u8").astype(np.uint64).reshape(rows, -1)
    if (arr >= np.uint64(F.P)).any():
        raise SyncError(f"the check message's {what} are not field elements")
    return arr


def _head(index: int, count: int, n: int, context: bytes) -> bytes:
    return index.to_bytes(4, "big") + count.to_bytes(4, "big") + n.to_bytes(8, "big") + context


def lead(local: Local, check: Check, key: bytes, fingerprint: bytes, send: Callable[[bytes], bytes]) -> np.ndarray:
    """Server 0's part of messages 5 to 8 (`send` posts one sealed message to server 1 and returns its
    answer): returns the verdict of every report of R (uint8, `verify.OK` or a reason class)."""
    chunks, n = local.chunks(), len(local.ids)
    verdicts = np.zeros(n, np.uint8)
    for c, part in enumerate(chunks):
        rows = part.stop - part.start
        head = _head(c, len(chunks), n, local.context)
        _, answer = open_sealed(key, fingerprint, send(seal(key, 5, fingerprint, head + local.message[part].astype("<u8").tobytes())), (6,))
        if answer[:4] != c.to_bytes(4, "big"):
            raise SyncError("server 1 answered another chunk of the check")
        width = 8 * check.opened * rows
        theirs, v_1 = _rows(answer[4:4 + width], rows, "messages"), _rows(answer[4 + width:], rows, "values")
        opened = F.add(local.message[part], theirs.reshape(rows, check.opened))
        v_0 = check.round_two(0, local.state[part], opened, local.extras[part]).reshape(rows, -1)
        if v_0.shape != v_1.shape:
            raise SyncError("server 1's check values do not fit its reports")
        verdicts[part] = _decide(check, opened, F.add(v_0, v_1))
        body = c.to_bytes(4, "big") + v_0.astype("<u8").tobytes()
        _, ack = open_sealed(key, fingerprint, send(seal(key, 7, fingerprint, body)), (8,))
        if not hmac.compare_digest(ack, _digest(body)):
            raise SyncError("server 1 acknowledged another chunk of the check")
    return verdicts


def _decide(check: Check, opened: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The verdicts from the opened round-one values and the opened V (one column, or several)."""
    return check.verdicts(opened, v[:, 0] if v.shape[1] == 1 else v)


def _digest(body: bytes) -> bytes:
    return body[:4] + hashlib.sha256(body).digest()


@dataclass
class Helper:
    """Server 1's state across messages 5 to 9 of one close (kept in memory: a restart of server 1
    makes server 0's close fail with a 502, and closing again starts over)."""
    local: Local
    opened: dict[int, np.ndarray] = field(default_factory=dict)
    v_1: dict[int, np.ndarray] = field(default_factory=dict)
    verdicts: dict[int, np.ndarray] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, check: Check, key: bytes, fingerprint: bytes, message: bytes) -> tuple[bytes, bytes | None]:
        """Server 1's answer to message 5, 7 or 9; for 9 also server 0's final set hash (the caller
        finishes, `finish`, and seals the answer with `final_answer`)."""
        rnd, body = open_sealed(key, fingerprint, message, (5, 7, 9))
        chunks, local = self.local.chunks(), self.local
        if rnd == 9:
            if body[:4] != len(chunks).to_bytes(4, "big") or len(body) != 4 + 32 + 32 or body[4:36] != local.context:
                raise SyncError("server 0 finished a check of another report set")
            if len(self.verdicts) != len(chunks):
                raise SyncError("server 0 finished the check before every chunk was decided")
            return b"", body[36:]
        c = int.from_bytes(body[:4], "big")
        if c >= len(chunks):
            raise SyncError("the check message names a chunk past the end")
        part = chunks[c]
        rows = part.stop - part.start
        if rnd == 5:
            if body[:_HEAD] != _head(c, len(chunks), len(local.ids), local.context):
                raise SyncError("server 0 checks another report set than server 1's")
            theirs = _rows(body[_HEAD:], rows, "messages")
            if theirs.shape[1] != check.opened:
                raise SyncError("the check message's messages do not fit its reports")
            opened = F.add(local.message[part], theirs)
            v_1 = check.round_two(1, local.state[part], opened, local.extras[part]).reshape(rows, -1)
            with self.lock:
                self.opened[c], self.v_1[c] = opened, v_1
            reply = c.to_bytes(4, "big") + local.message[part].astype("<u8").tobytes() + v_1.astype("<u8").tobytes()
            return seal(key, 6, fingerprint, reply), None
        with self.lock:
            if c not in self.opened:
                raise SyncError("server 0 sent its check values before its messages")
            v_0 = _rows(body[4:], rows, "values")
            if v_0.shape != self.v_1[c].shape:
                raise SyncError("the check message's values do not fit its reports")
            self.verdicts[c] = _decide(check, self.opened[c], F.add(v_0, self.v_1[c]))
        return seal(key, 8, fingerprint, _digest(body)), None

    def all_verdicts(self) -> np.ndarray:
        return np.concatenate([self.verdicts[c] for c in range(len(self.local.chunks()))]) if self.local.ids else np.zeros(0, np.uint8)


def finish_message(local: Local, final_hash: str, key: bytes, fingerprint: bytes) -> bytes:
    """Message 9: the chunk count, H_R and server 0's set hash after its exclusions."""
    return seal(key, 9, fingerprint, len(local.chunks()).to_bytes(4, "big") + local.context + bytes.fromhex(final_hash))


def final_answer(final_hash: str, key: bytes, fingerprint: bytes) -> bytes:
    return seal(key, 10, fingerprint, bytes.fromhex(final_hash))


def read_final_answer(message: bytes, key: bytes, fingerprint: bytes) -> str:
    return open_sealed(key, fingerprint, message, (10,))[1].hex()


def finish(store: Store, config: TaskConfig, party: int, pair_key: bytes, local: Local, verdicts: np.ndarray) -> str:
    """Excludes every failed report under its reason class (idempotent), stores this server's
    histogram share over the passing reports (the sum over R minus the failures' values, recomputed),
    and returns the keyed hash of the passing set."""
    task_id = config.task_id
    if store.marked(task_id, Mark.VERIFIED):  # done before (a repeated close): the same verdicts, nothing to change
        return store.frozen(task_id).digest
    set_hash = lambda ids: reconcile.set_hash(pair_key, ids)  # noqa: E731
    frozen = store.frozen(task_id)  # the reconciled set; each exclusion below returns the set after it
    for code, name in REASONS.items():
        ids = [local.ids[k] for k in np.flatnonzero(verdicts == code)]
        if ids:
            frozen = store.exclude(task_id, ids, set_hash, reason=name)
    histogram = F.sub(local.total, grid_sum(store, config, party, [local.ids[k] for k in np.flatnonzero(verdicts != OK)]))
    store.save_histogram(task_id, frozen.digest, histogram.shape, histogram.astype("<u8").tobytes())
    return frozen.digest


def mark_if_agreed(store: Store, task_id: str, mine: str, theirs: str) -> bool:
    if hmac.compare_digest(mine, theirs):
        store.mark(task_id, Mark.VERIFIED)
        return True
    return False
