"""Round one of the report check of a verified task (`verification.maths.Check`), computed while its reports
arrive: each server evaluates every key share it stores over the whole grid once, in batches of
consecutive reports, and keeps per report only its round-one message, state and check randomness
(a few field elements), plus the sum of the batch's grid values (its share of their histogram).
At the close, `prepare` reads the batches back for the reconciled set R (the reports of a batch
that the reconciliation dropped are left out and their grid values subtracted), so the close itself
no longer evaluates a key (issue 12: a close of 10^6 reports is its messages, not 10^6 grid walks).

The challenges: both servers derive them from a subkey of their shared K and the task id only
(`challenges`), so they are the same for every batch on both servers however the batches are cut.
Security, next to what `outcome` states for the exchange:
- A malicious client cannot predict them: K comes from the two servers' X25519 keys (`reconciliation.maths`)
  and no client, and no analyst, holds it; nothing a server sends before the close depends on them
  (the round-one values are opened only in the close's messages), so a client learns nothing about
  them before or after its upload that it could use in this task. Its report is a function of its
  own choices, independent of the challenges, which is all the check's soundness needs (error at
  most 2/p per report, docs/verification.md). The earlier design fixed them only at the close (from
  H_R); that also kept them from a server colluding with a client, which buys nothing: a server
  can move the release by itself (it can add anything to its own answers), so robustness against
  clients presumes two honest servers, as in Prio3, whose verification key is likewise fixed per task.
- The stored values leak nothing new: a server already holds the key shares they are computed from.
- Cost: a report that reached one server only is evaluated there twice (in its batch, and again at
  the close to subtract it); a client that uploads to one server only spends half an honest
  client's sealing work on it (`tests/service/system/test_round_one_on_servers.py` pins this).
- Re-running is safe: batches are consecutive ranges of the task's reports; a batch is stored only if
  it starts after the last stored one (`Store.add_check_batch`), so a concurrent or repeated run
  stores nothing twice, and everything is a deterministic function of the shares and K.
The batches' machinery (the per-task lock, storing a batch, the sum over R less the drops) is
`protocols.grid_sums`, which unverified tasks' histogram share runs through too.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass

import numpy as np

from fss import DCF, KeyBatch
from fss import field as F

from ....errors import ParameterError
from ....release.payload import Payload
from ...storage.records import CheckBatch
from ...verification import sketch
from ...verification.maths import Check
from .. import grid_sums
from ..context import StepContext
from ..grid_sums import decode_shares, lock, share_rows, store_batch  # noqa: F401 (their old home: callers use round_one's)
from ..reconciliation import maths as reconcile
from ..reconciliation.maths import SyncError

MESSAGE_ELEMENTS = 1 << 21  # field elements per message (16 MiB, under the 64 MiB body limit)
# grid values evaluated at once: 16 MiB. At 32 MiB every pass's fresh arrays came from mmap (glibc's
# threshold stops growing at 32 MiB), so each pass paid a page fault per 4 KiB written: 2048 keys a
# pass at 2^10 walk 1.2-1.6x as many keys per second as 4096 did.
PASS_ELEMENTS = 1 << 21


def keys_per_pass(size: int, width: int) -> int:
    """Keys evaluated over the grid at once: about PASS_ELEMENTS values (2048 keys at 2^10 points)."""
    return max(16, PASS_ELEMENTS // (size * width))


def verification_key(pair_key: bytes) -> bytes:
    """The challenges' key: a subkey of the servers' shared K (no client or analyst can compute it)."""
    return hmac.new(pair_key, b"verify challenges", hashlib.sha256).digest()


def challenges(check: Check, pair_key: bytes, task_id: str):
    """The task's challenges, the same on both servers for every batch (see the module docstring).
    Derived once per task and kept: at 2^16 grid points they cost about as much as a batch's keys."""
    return _challenges(check.payload, check.size, pair_key, task_id)


@functools.lru_cache(maxsize=16)
def _challenges(payload: str, size: int, pair_key: bytes, task_id: str):
    return Check(payload, size).challenges(verification_key(pair_key), b"dpcdf round one/" + task_id.encode())


def grid_values(dcf: DCF, batch: KeyBatch, size: int) -> np.ndarray:
    """Every key's shares at grid indices 0 .. size-1: (n, size, width) uint64."""
    y = dcf.eval_grid(batch, size)
    return np.ascontiguousarray(y.reshape(len(batch), size, dcf.width))


def pass_sums(dcf: DCF, check: Check, party: int, batch: KeyBatch, extras: np.ndarray, ch) -> tuple[np.ndarray, ...]:
    """`check.round_one_sums(party, grid_values(dcf, batch, check.size), extras, ch)`, the same bits: for
    the MAC'd count and label checks from `DCF.eval_grid_sums` (z, l of the values and zt of the tags,
    the values' column sums and the last point; each key's grid values reduced while in cache, never
    stored as an (n, size, 2 width) array), for the others through `grid_values`."""
    if dcf.width != check.key_width:  # as round_one_sums refuses grid values of another width
        raise ParameterError(f"keys of width {check.key_width} expected for this check, got {dcf.width}")
    if not check.mac:
        return check.round_one_sums(party, grid_values(dcf, batch, check.size), extras, ch)
    if check.payload.scored:  # the calibration sketch is linear too: six weighted sums, read in place (issue 46)
        dots, sums, last = dcf.eval_grid_sums(batch, check.size, calibration_weights(ch), [0, 0, 0, 2, 3, 3])
        return (*check.calibration_mac_messages(party, dots, last, extras, ch), sums)
    w = check.width
    dots, sums, last = dcf.eval_grid_sums(batch, check.size, np.stack([ch.wz, ch.wl, ch.wz]), [0, 0, w])
    top, topt = np.full(len(batch), 1 if party == 0 else 0, np.uint64), np.zeros(len(batch), np.uint64)
    for c in range(w):  # as `sketch.sketch_mac`: one - the last point's values, minus its tags (F.sum: 4x the time)
        top, topt = F.sub(top, last[:, c]), F.sub(topt, last[:, w + c])
    msg, state = check.mac_messages(dots[:, 0], dots[:, 1], top, dots[:, 2], topt, extras, ch)
    return msg, state, sums


def calibration_weights(ch) -> np.ndarray:
    """(6, N, 3) weights of the MAC'd calibration sketch for `DCF.eval_grid_sums` at offsets 0, 0, 0, 2,
    3, 3: the values' z (wz on components 0, 1), L (wl), w (rho on 0), u (rho on 2), then the tags' z and
    w (components 3, 4 and 5); the column sums are those of the values (1, label, q)."""
    w, zero = ch.w, np.zeros(ch.w.shape[0], np.uint64)
    rho = np.column_stack([w[:, 4], zero, zero])
    return np.ascontiguousarray(np.stack([np.column_stack([w[:, 0], w[:, 1], zero]), np.column_stack([w[:, 2], w[:, 3], zero]),
                                          rho, rho, np.column_stack([w[:, 0], w[:, 1], zero]), rho]))


def warm_up(payloads: tuple[str, ...] = tuple(Payload)) -> None:
    """Compiles (or loads from numba's disk cache) what a verified close runs: the grid kernel of
    each payload's width over F_p, and the check's sums; about 4 s the first time after an
    install, a fraction of a second after, instead of inside the first close."""
    for payload in payloads:
        check = Check(payload, 4, mac=True)
        dcf = DCF(2, width=check.key_width, cmp="ge", group="p61")
        keys, _ = dcf.gen_batch(np.arange(2), np.ones((2, check.key_width), np.int64))
        y = grid_values(dcf, keys, 4)
        ch = check.challenges(b"k" * 32, b"warm")
        check.round_one_sums(0, y, np.zeros((2, check.extras), np.uint64), ch)
        pass_sums(dcf, check, 0, keys, np.zeros((2, check.extras), np.uint64), ch)
        sketch.value_sums(y, check.width)


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


def step(ctx: StepContext, limit: int | None = None) -> int:
    """Round one for the task's next stored reports not yet in a batch (one pass at most): evaluates
    their keys over the grid and stores the batch. Returns how many reports it took (0: caught up)."""
    config = ctx.config
    dcf, check = config.key_dcf(), config.check()
    seqs, ids, shares = ctx.store.unchecked(config.task_id, limit or keys_per_pass(check.size, dcf.width))
    if not ids:
        return 0
    store_batch(ctx, seqs, ids, evaluate(dcf, check, ctx.party, shares, challenges(check, ctx.pair_key, config.task_id)))
    return len(ids)


def evaluate(dcf: DCF, check: Check, party: int, shares: list[bytes] | bytes, ch) -> tuple[np.ndarray, ...]:
    """One batch's round one from its stored shares alone (as in `share_rows`): (extras, message,
    state, grid sums), a pass of `keys_per_pass` keys at a time (the sums added mod p). A pure
    function of the shares and the challenges `ch` (what a Dask worker runs, `server.dask_check`)."""
    per, parts, rows = keys_per_pass(check.size, dcf.width), [], share_rows(dcf, check.extras, shares)
    total = np.zeros((check.size, check.width), np.uint64)
    for start in range(0, len(rows), per):
        batch, x = decode_shares(dcf, check.extras, rows[start:start + per], party)
        msg, st, sums = pass_sums(dcf, check, party, batch, x, ch)
        parts.append((x, msg, st))
        total = F.add(total, sums) if start else sums
    return (*(np.concatenate(c) for c in zip(*parts)), total)


def catch_up(ctx: StepContext) -> int:
    """Round one for every stored report of the task not yet in a batch; returns how many."""
    cluster = getattr(ctx, "round_one_map", None)
    if cluster is None:
        return grid_sums.run(ctx, step)
    with lock(ctx.store, ctx.config.task_id):  # the server's Dask cluster (`server.dask_check`): the same batches, the same bits
        return cluster(ctx)


def prepare(ctx: StepContext) -> Local:
    """After the reconciliation: every report of R's round one (catching up first), in the order
    of the sorted ids (both servers' order in the messages), and the sum of R's grid values."""
    store, config, pair_key = ctx.store, ctx.config, ctx.pair_key
    task_id, check = config.task_id, config.check()
    catch_up(ctx)
    ids = store.reconciled_ids(task_id)
    raw_hash = bytes.fromhex(reconcile.set_hash(pair_key, ids))
    batches = store.check_batches(task_id)
    if not ids:
        return Local(ids, raw_hash, np.zeros((0, check.extras), np.uint64), np.zeros((0, check.opened), np.uint64),
                     np.zeros((0, 0), np.uint64), np.zeros((check.size, check.width), np.uint64))
    n = sum(b.n for b in batches)
    message, extras = _column(batches, "message", n, check.opened), _column(batches, "extras", n, check.extras)
    state = _column(batches, "state", n, sum(len(b.state) for b in batches) // 8 // max(n, 1))
    # the reconciliation's drops: out of R, their grid values out of the sum
    total, keep = grid_sums.total(batches, FieldSums(config.key_dcf(), check), store.dropped_ids(task_id),
                                  lambda dropped: grid_sum(ctx, dropped))
    order = sorting(ids, grid_sums.stored_ids(batches)[keep])
    return Local(ids, raw_hash, extras[keep][order], message[keep][order], state[keep][order], total)


@dataclass(frozen=True)
class FieldSums:
    """A verified task's grid sums (`grid_sums.Sums`): the values' shares in F_p, (size, width)."""
    dcf: DCF
    check: Check

    @property
    def size(self) -> int:
        return self.check.size

    @property
    def width(self) -> int:
        return self.check.width

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return F.add(a, b)

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return F.sub(a, b)

    def of_shares(self, party: int, shares: list[bytes] | bytes) -> np.ndarray:
        return shares_grid_sum(self.dcf, self.check, party, shares)


def grid_sum(ctx: StepContext, ids: list[bytes]) -> np.ndarray:
    """The sum of these stored reports' grid values, (size, width) in F_p: their keys evaluated
    again (the reports a close takes out of a sum it already holds), a pass at a time, or on the
    server's Dask cluster (`dask_check.RoundOneMap.grid_sum`)."""
    cluster = getattr(ctx, "round_one_map", None)
    if cluster is not None:
        return cluster.grid_sum(ctx, ids)
    dcf, check = ctx.config.key_dcf(), ctx.config.check()
    return grid_sums.grid_sum(ctx, FieldSums(dcf, check), ids, keys_per_pass(check.size, dcf.width))


def shares_grid_sum(dcf: DCF, check: Check, party: int, shares: list[bytes] | bytes) -> np.ndarray:
    """The sum of these stored shares' grid values (as in `share_rows`), (size, width) in F_p, a pass
    at a time: a pure function of the shares (what a Dask worker runs)."""
    total, rows = np.zeros((check.size, check.width), np.uint64), share_rows(dcf, check.extras, shares)
    per = keys_per_pass(check.size, dcf.width)
    for start in range(0, len(rows), per):
        batch, _ = decode_shares(dcf, check.extras, rows[start:start + per], party)
        total = F.add(total, sketch.value_sums(grid_values(dcf, batch, check.size), check.width))
    return total


def data(check: Check, y: np.ndarray) -> np.ndarray:
    """The report's own values of grid values y (n, size, key_width): without the MAC's kappa * beta
    (a copy; the servers sum them in place, `Check.round_one_sums` and `sketch.value_sums`)."""
    return np.ascontiguousarray(y[:, :, :check.width])


def _column(batches: list[CheckBatch], field: str, n: int, k: int) -> np.ndarray:
    """One of the batches' per-report arrays, all batches in order: (n, k) field elements."""
    return np.frombuffer(b"".join(getattr(b, field) for b in batches), "<u8").astype(np.uint64).reshape(n, k)


def sorting(ids: list[bytes], stored: np.ndarray) -> np.ndarray:
    """The permutation that takes `stored` (R's ids in storage order, (n, width) uint8 rows) to `ids`
    (R's ids sorted bytewise, `Store.reconciled_ids`): a lexicographic sort of the ids as big-endian
    64-bit words. SyncError if they are not the same set of equal-length ids (the set changed
    between the two reads): never a report checked at another's position."""
    n, width = stored.shape
    raw = b"".join(ids)
    if n != len(ids) or len(raw) != width * n:
        raise SyncError("the stored report set changed while the check read it")
    words = -(-width // 8)
    padded = np.zeros((n, 8 * words), np.uint8)
    padded[:, :width] = stored
    order = np.lexsort(padded.view(">u8").reshape(n, words).T[::-1])
    if stored[order].tobytes() != raw:
        raise SyncError("the stored report set changed while the check read it")
    return order
