"""Grid sums in batches, computed while a task's reports arrive (issue 12 for verified tasks, issue 44
for unverified ones): each server evaluates every key share it stores over the whole grid once, in
batches of consecutive reports of the task (`run`: the background worker, `server.checker`, woken by
uploads; a close catches up on the rest), and stores per batch its first and last sequence numbers,
its report ids and the sum of its grid values (`Store.add_check_batch`): its share of their
histogram. At the close, the histogram share of the reconciled set is the sum of the batches less
the grid values of the reports the reconciliation dropped, which are evaluated again (`total`), so
the close itself evaluates only those and the reports not yet in a batch.

A verified task's batches also hold its round one of the report check (`check.round_one`, whose
`step` and sums, over F_p, run through `run` and `total`). An unverified task's hold the sums only
(`RingSums`, mod 2^out_bits): its close stores its histogram share of the reconciled set
(`histogram`, `Store.save_histogram`), and every query reads it, in O(grid) whatever n is. That is for
grids of up to `GRID_SUMS_MAX` points (each batch's row holds a whole grid of sums); larger grids keep
evaluating the key shares at each query.

Security (unverified tasks; `check.round_one` states the verified case): the stored sums are a function
of this server's own key shares, summed over reports it holds: what it stores anyway, and the same
values a query's evaluation of those shares computes (`Aggregator.grid_histogram`), only earlier.
Nothing is sent to the other server, the analyst or a client, so nothing new leaks; a query releases
the same bits as before (sums mod 2^64 are exact whatever the cut into batches, and the noise is
added after, as before). Timing: the work is the server's own, woken by uploads, and grows with them,
as ingest does; a query's answer no longer depends on n (only on the grid and the query), which
closes the timing channel on n that unverified tasks' queries had (docs/service.md, trust model).

Re-running is safe: a batch is stored only if it starts after the last stored one (`Store.add_check_batch`,
under the per-task `lock`), so a concurrent or repeated run stores nothing twice; a crash loses at most
the batch in flight, which the next run (the worker's start, the close, or the first query) evaluates
again, and everything is a deterministic function of the stored shares. While the collection is
open an unverified task stores full batches only (`RingSums.per_batch` reports), so a trickle of
uploads does not store a grid of sums per report; the close takes the last partial one.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from fss import DCF, FssError, KeyBatch, layout

from ...errors import ParameterError
from ..storage.records import CheckBatch
from ..storage.store import Store
from ..task import TaskConfig
from .context import StepContext
from .reconciliation.maths import SyncError

GRID_SUMS_MAX = 1 << 16  # grids up to this size: an unverified task's histogram share is summed in batches too
SUM_PASS = 1 << 14  # an unverified task's keys per `DCF.eval_sum` call (no (keys, grid) array: the kernel sums)
# an unverified task's batches (`RingSums.per_batch`): about BATCH_VALUES grid values each (16384 reports at 2^10
# points: a batch's commit, fsynced, cost more than its evaluation at 2048), at most MAX_BATCH reports
BATCH_VALUES, MAX_BATCH = 1 << 24, 1 << 16


class Sums(Protocol):
    """A task's grid sums: their shape and group, and the sum of some stored shares' grid values."""
    @property
    def size(self) -> int: ...

    @property
    def width(self) -> int: ...

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...

    def of_shares(self, party: int, shares: list[bytes] | bytes) -> np.ndarray: ...


def share_rows(dcf: DCF, extras: int, shares: list[bytes] | bytes | np.ndarray) -> np.ndarray:
    """Stored shares (a list, or joined into one bytes: what a Dask worker gets, one object to send
    instead of a thousand) as (n, key size + 8 extras) uint8 rows; SyncError for a wrong length."""
    if isinstance(shares, np.ndarray):
        return shares
    width = dcf.key_size + 8 * extras
    blob = shares if isinstance(shares, bytes) else b"".join(shares)
    n = len(blob) // width if isinstance(shares, bytes) else len(shares)
    try:
        return np.frombuffer(blob, np.uint8).reshape(n, width)
    except ValueError:
        raise SyncError("a stored share has the wrong length for this task") from None


def decode_shares(dcf: DCF, extras: int, shares: list[bytes] | bytes | np.ndarray,
                  party: int) -> tuple[KeyBatch, np.ndarray]:
    """Stored shares (each a key, then `extras` field elements; checked at upload by
    `wire.split_share`; as in `share_rows`) -> (their keys as one batch, the extras (n, extras)), in
    one vectorized pass."""
    size = dcf.key_size
    rows = share_rows(dcf, extras, shares)
    try:
        keys = layout.batch_from_rows(dcf, rows[:, :size], party)  # read in place
    except FssError as exc:  # before fss.layout a KeyFormatError escaped here (review of issue 43): say why
        raise SyncError(f"a stored share is not a key of this task's function ({exc})") from None
    values = np.ascontiguousarray(rows[:, size:]).view("<u8").astype(np.uint64).reshape(len(rows), extras)
    return keys, values


@dataclass(frozen=True)
class RingSums:
    """An unverified task's grid sums: `dcf`'s shares (mod 2^out_bits) at grid indices 0 .. size - 1,
    (size, width) uint64."""
    dcf: DCF
    size: int

    @property
    def width(self) -> int:
        return self.dcf.width

    @property
    def per_batch(self) -> int:
        """Reports per stored batch: BATCH_VALUES grid values' worth, at most MAX_BATCH, and enough that a
        batch's sums (a whole grid) are at most 64 bytes a report (8192 reports at 2^16 points)."""
        values = self.size * self.width
        return max(min(MAX_BATCH, BATCH_VALUES // values), values // 8)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a + b) & np.uint64(self.dcf.params.mask)

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a - b) & np.uint64(self.dcf.params.mask)

    def of_shares(self, party: int, shares: list[bytes] | bytes | np.ndarray) -> np.ndarray:
        """The sum of these stored key shares' values at every grid index, (size, width): `DCF.eval_sum`
        at all the points, SUM_PASS keys at a time. A pure function of the shares; the same bits as
        `Aggregator.grid_histogram` of them."""
        rows, points = share_rows(self.dcf, 0, shares), np.arange(self.size, dtype=np.int64)
        total = np.zeros((self.size, self.width), np.uint64)
        for start in range(0, len(rows), SUM_PASS):
            keys, _ = decode_shares(self.dcf, 0, rows[start:start + SUM_PASS], party)
            total = self.add(total, self.dcf.eval_sum(keys, points).reshape(self.size, self.width))
        return total


def summed(config: TaskConfig) -> bool:
    """Whether a task's reports are summed in batches for its histogram share: unverified, on a grid of
    up to GRID_SUMS_MAX points (the one rule the worker, the close and the queries read)."""
    return not config.verify and config.make_grid().size <= GRID_SUMS_MAX


def ring_sums(ctx: StepContext) -> RingSums | None:
    """An unverified task's `RingSums` if it is `summed`, else None."""
    return RingSums(ctx.config.dcf(), ctx.config.make_grid().size) if summed(ctx.config) else None


_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def lock(store: Store, task_id: str) -> threading.Lock:
    """One batch run at a time per task and store (the background worker and a close)."""
    with _locks_guard:
        return _locks.setdefault((str(store.path), task_id), threading.Lock())


def run(ctx: StepContext, step: Callable[[StepContext], int]) -> int:
    """`step` until it takes no more reports, under the task's `lock`; returns how many it took."""
    done = 0
    with lock(ctx.store, ctx.config.task_id):
        while (k := step(ctx)):
            done += k
    return done


def store_batch(ctx: StepContext, seqs: list[int], ids: list[bytes] | bytes, result: tuple[np.ndarray, ...]) -> bool:
    """Stores one batch (reports `seqs`, first to last; `ids` a list or joined): `result` is its
    per-report extras, messages and states (n rows each; no columns for an unverified task) and its
    grid sums. False if it was stored already."""
    n = len(result[0])
    x, msg, st, sums = (np.ascontiguousarray(a, dtype="<u8").tobytes() for a in result)
    batch = CheckBatch(seqs[0], seqs[-1], n, ids if isinstance(ids, bytes) else b"".join(ids), msg, st, x, sums)
    return ctx.store.add_check_batch(ctx.config.task_id, batch)


def step(ctx: StepContext) -> int:
    """An unverified task's next batch of stored reports not yet in one: their grid sums, stored.
    While the collection is open, only a full batch (`RingSums.per_batch`); returns how many reports
    it took (0: caught up, or waiting for a full batch)."""
    sums = ring_sums(ctx)
    if sums is None:
        return 0
    store, task_id, per = ctx.store, ctx.config.task_id, sums.per_batch
    if _collecting(store, task_id) and store.unchecked_count(task_id, per) < per:
        return 0  # (counted first: a wake per upload reads no shares until a batch is full)
    seqs, ids, shares, lengths = store.unchecked_joined(task_id, per)
    n = len(shares) // sums.dcf.key_size
    if not seqs or (n < per and _collecting(store, task_id)):
        return 0
    if lengths != {sums.dcf.key_size}:
        raise SyncError("a stored share has the wrong length for this task")
    empty = np.zeros((n, 0), np.uint64)
    stored = store_batch(ctx, seqs, ids, (empty, empty, empty, sums.of_shares(ctx.party, shares)))
    return n if stored else 0  # not stored: the task was purged meanwhile (the runs share the task's lock)


def _collecting(store: Store, task_id: str) -> bool:
    life = store.lifecycle(task_id)
    return life is not None and life.collecting


def catch_up(ctx: StepContext) -> int:
    """An unverified task's batches for every stored report not yet in one (`step`); returns how many."""
    return run(ctx, step)


def grid_sum(ctx: StepContext, sums: Sums, ids: list[bytes], per: int) -> np.ndarray:
    """The sum of these stored reports' grid values, (size, width): their shares read and evaluated
    again (the reports a close takes out of a sum it already holds), `per` at a time."""
    total = np.zeros((sums.size, sums.width), np.uint64)
    for start in range(0, len(ids), per):
        shares = ctx.store.shares_by_id(ctx.config.task_id, ids[start:start + per])
        total = sums.add(total, sums.of_shares(ctx.party, shares))
    return total


def stored_ids(batches: list[CheckBatch]) -> np.ndarray:
    """The batches' report ids in storage order, (n, id length) uint8 rows."""
    n = sum(b.n for b in batches)
    raw = b"".join(b.ids for b in batches)
    return np.frombuffer(raw, np.uint8).reshape(n, len(raw) // max(n, 1))


def total(batches: list[CheckBatch], sums: Sums, dropped: list[bytes],
          drop_sum: Callable[[list[bytes]], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of the batches' grid sums less those of the `dropped` reports in them (`drop_sum(ids)`:
    their grid values evaluated again), and which of the batches' reports are kept (a bool per report,
    in storage order)."""
    out = np.zeros((sums.size, sums.width), np.uint64)
    for b in batches:
        out = sums.add(out, np.frombuffer(b.sums, "<u8").astype(np.uint64).reshape(sums.size, sums.width))
    keep = np.ones(sum(b.n for b in batches), bool)
    if dropped and len(keep):
        stored = stored_ids(batches)
        width = stored.shape[1]
        keep = ~np.isin(np.frombuffer(stored.tobytes(), f"S{width}"), np.frombuffer(b"".join(dropped), f"S{width}"))
        out = sums.sub(out, drop_sum([bytes(stored[k]) for k in np.flatnonzero(~keep)]))
    return out, keep


def histogram(ctx: StepContext) -> np.ndarray:
    """An unverified task's histogram share of its reconciled set, (size, width): its batches caught up
    (up to the frozen set's last report), summed, less the reports the reconciliation dropped. Called
    once the task is reconciled (its set no longer changes)."""
    sums = ring_sums(ctx)
    if sums is None:
        raise ParameterError(f"task {ctx.config.task_id} is not summed in batches (verified, or a grid above {GRID_SUMS_MAX})")
    catch_up(ctx)
    store, task_id = ctx.store, ctx.config.task_id
    return total(store.check_batches(task_id), sums, store.dropped_ids(task_id),
                 lambda ids: grid_sum(ctx, sums, ids, sums.per_batch))[0]
