"""The report check at the close of a verified task (issue 12): the two servers run `verify.Check`
on every reconciled report, exclude each failure (counted per reason class) identically, and keep
their share of the histogram of the reports that passed, from which every query is answered.

After the reconciliation both servers hold one report set R (its keyed hash H_R is equal on both).
Each server evaluates every key share of R once over the whole grid (`grid_values`), which gives the
check's input and, summed, its share of the histogram. The challenges come from a key only the two
servers hold (a subkey of the reconciliation's K) and the context (task id, H_R): a client cannot
predict them, and they are fixed only after its report is stored. The messages (AES-GCM under K, as
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

from fss import DCF, KeyBatch
from fss import field as F

from . import _sketch, reconcile
from .reconcile import SyncError, open_sealed, seal
from .store import Mark, Store
from .task import TaskConfig
from .verify import OK, REASONS, Check

MESSAGE_ELEMENTS = 1 << 21  # field elements per message (16 MiB, under the 64 MiB body limit)
PASS_ELEMENTS = 1 << 22  # grid values evaluated at once (32 MiB, a few times that in eval_grid's buffers)


def keys_per_pass(size: int, width: int) -> int:
    """Keys evaluated over the grid at once: about PASS_ELEMENTS values (4096 keys at 2^10 points)."""
    return max(16, PASS_ELEMENTS // (size * width))
_HEAD = 4 + 4 + 8 + 32  # chunk index, chunk count, report count, H_R


def verification_key(pair_key: bytes) -> bytes:
    """The challenges' key: a subkey of the servers' shared K (no client or analyst can compute it)."""
    return hmac.new(pair_key, b"verify challenges", hashlib.sha256).digest()


def grid_values(dcf: DCF, batch: KeyBatch, size: int) -> np.ndarray:
    """Every key's shares at grid indices 0 .. size-1: (n, size, width) uint64."""
    y = dcf.eval_grid(batch, size)
    return np.ascontiguousarray(y.reshape(len(batch), size, dcf.width))


def warm_up() -> None:
    """Compiles (or loads from numba's disk cache) what a verified close runs: the grid kernel of
    every payload's width over F_p, and the check's sums; about 4 s the first time after an
    install, a fraction of a second after, instead of inside the first close."""
    for payload in ("count", "label", "calibration"):
        check = Check(payload, 4)
        dcf = DCF(2, width=check.width, cmp="ge", group="p61")
        keys, _ = dcf.gen_batch(np.arange(2), 1 if check.width == 1 else np.ones((2, check.width), np.int64))
        check.round_one(0, grid_values(dcf, keys, 4), np.zeros((2, check.extras), np.uint64), check.challenges(b"k" * 32, b"warm"))
        _sketch.column_sums(grid_values(dcf, keys, 4))


def decode_shares(dcf: DCF, extras: int, shares: list[bytes], party: int) -> tuple[KeyBatch, np.ndarray]:
    """Stored shares (each a key, then `extras` field elements; checked at upload by
    `wire.split_share`) -> (their keys as one batch, the extras (n, extras)), in one vectorized pass."""
    size = dcf.key_size
    try:
        rows = np.frombuffer(b"".join(shares), np.uint8).reshape(len(shares), size + 8 * extras)
    except ValueError:
        raise SyncError("a stored share has the wrong length for this task") from None
    header = np.frombuffer(dcf.params.header(party), np.uint8)
    if (rows[:, :header.size] != header).any():
        raise SyncError("a stored share is not a key of this task's function")
    blob = dcf.params.header(party, batch=True) + len(shares).to_bytes(8, "little") + rows[:, header.size:size].tobytes()
    values = np.ascontiguousarray(rows[:, size:]).view("<u8").astype(np.uint64).reshape(len(shares), extras)
    return dcf.batch_from_bytes(blob, party), values


@dataclass
class Local:
    """One server's side of the check over R: its round-one messages and state, the client's check
    randomness, and its share of the histogram over all of R (`total`, (size, width))."""
    ids: list[bytes]
    context: bytes
    extras: np.ndarray
    message: np.ndarray
    state: np.ndarray
    total: np.ndarray

    def chunks(self) -> list[slice]:
        """Reports per message: MESSAGE_ELEMENTS over the elements each report sends (its round-one
        message and, in the answer, its check values too)."""
        n, per = len(self.ids), max(1, MESSAGE_ELEMENTS // (self.message.shape[1] + 4))
        return [slice(s, min(s + per, n)) for s in range(0, n, per)]


def prepare(store: Store, config: TaskConfig, party: int, pair_key: bytes) -> Local:
    """Evaluates every reconciled key share over the grid once: round one of the check, and the sum.
    The shares are read in storage order (a table scan); the per-report results are then put in the
    order of the sorted ids, the order both servers use in the messages (`sorting`)."""
    task_id, dcf, check = config.task_id, config.dcf(), config.check()
    size = config.make_grid().size
    ids = store.reconciled_ids(task_id)
    raw_hash = bytes.fromhex(reconcile.set_hash(pair_key, ids))
    context = b"%s/%d/" % (task_id.encode(), len(ids)) + raw_hash
    ch = check.challenges(verification_key(pair_key), context)
    total = np.zeros((size, dcf.width), np.uint64)
    stored, messages, states, extras = [], [], [], []
    for chunk_ids, shares in store.reconciled_shares(task_id, keys_per_pass(size, dcf.width)):
        batch, x = decode_shares(dcf, check.extras, shares, party)
        y = grid_values(dcf, batch, size)
        msg, st = check.round_one(party, y, x, ch)
        stored += chunk_ids
        messages.append(msg)
        states.append(st)
        extras.append(x)
        total = F.add(total, _sketch.column_sums(y))
    if not ids:
        return Local(ids, raw_hash, np.zeros((0, check.extras), np.uint64), np.zeros((0, check.opened), np.uint64),
                     np.zeros((0, 0), np.uint64), total)
    order = sorting(ids, stored)
    return Local(ids, raw_hash, np.concatenate(extras)[order], np.concatenate(messages)[order],
                 np.concatenate(states)[order], total)


def sorting(ids: list[bytes], stored: list[bytes]) -> np.ndarray:
    """The permutation that takes `stored` (R's ids in storage order) to `ids` (R's ids sorted
    bytewise, `Store.reconciled_ids`): a lexicographic sort of the ids as big-endian 64-bit words.
    SyncError if they are not the same set of equal-length ids (the set changed between the two
    reads): never a report checked at another's position."""
    width = len(ids[0])
    raw = b"".join(stored)
    if len(stored) != len(ids) or len(raw) != width * len(ids) or len(b"".join(ids)) != len(raw):
        raise SyncError("the stored report set changed while the check read it")
    words = -(-width // 8)
    padded = np.zeros((len(ids), 8 * words), np.uint8)
    padded[:, :width] = np.frombuffer(raw, np.uint8).reshape(len(ids), width)
    cols = padded.view(">u8").reshape(len(ids), words)
    order = np.lexsort(cols.T[::-1])
    if np.frombuffer(raw, np.uint8).reshape(len(ids), width)[order].tobytes() != b"".join(ids):
        raise SyncError("the stored report set changed while the check read it")
    return order


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
    task_id, dcf = config.task_id, config.dcf()
    if store.marked(task_id, Mark.VERIFIED):  # done before (a repeated close): the same verdicts, nothing to change
        return store.frozen(task_id).digest
    set_hash = lambda ids: reconcile.set_hash(pair_key, ids)  # noqa: E731
    frozen = store.frozen(task_id)  # the reconciled set; each exclusion below returns the set after it
    for code, name in REASONS.items():
        ids = [local.ids[k] for k in np.flatnonzero(verdicts == code)]
        if ids:
            frozen = store.exclude(task_id, ids, set_hash, reason=name)
    failed = [local.ids[k] for k in np.flatnonzero(verdicts != OK)]
    histogram = local.total
    size, extras = config.make_grid().size, config.check().extras
    step = keys_per_pass(size, dcf.width)
    for start in range(0, len(failed), step):
        batch, _ = decode_shares(dcf, extras, store.shares_by_id(task_id, failed[start:start + step]), party)
        histogram = F.sub(histogram, _sketch.column_sums(grid_values(dcf, batch, size)))
    store.save_histogram(task_id, frozen.digest, histogram.shape, histogram.astype("<u8").tobytes())
    return frozen.digest


def mark_if_agreed(store: Store, task_id: str, mine: str, theirs: str) -> bool:
    if hmac.compare_digest(mine, theirs):
        store.mark(task_id, Mark.VERIFIED)
        return True
    return False
