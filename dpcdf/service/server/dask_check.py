"""Round one of a verified task's check on the server's Dask cluster (issue 24): `round_one.catch_up`
hands the task's unchecked reports here when the server runs with `--dask` (`TaskContext.round_one_map`).

The server reads the next reports' stored shares from SQLite (a few batches ahead), hands each
batch to the workers (a RAM spool file on `local:N`, else `scatter`; never through the scheduler:
`_submit`) with a task that runs `round_one.evaluate` on it (decode the key shares, `eval_grid` over
the whole grid, the check's sketch and the grid's column sums, a pass of `keys_per_pass` keys at a
time), and stores the results in upload order (`round_one.store_batch`). A batch is several passes
(`TASK_ELEMENTS`), so fewer and larger rows than in-process; each report's message, state and
extras, and the sum of the batches' grid sums (mod p), are the same bits whatever the cut.

What a worker holds, and why that is safe (docs/scaling.md says the same):
- the server's own key shares of its batch, with the client's check extras (this server's shares of
  (a, a^2), kappa x, kappa): what the server stores anyway; without the other server's shares they
  reveal nothing about a value (the non-collusion assumption extends to each server's cluster);
- the task's challenges (the folded weights `Challenges.wz`, `wl` and `s`; calibration also rho,
  sigma and the bit pairs): the sketch is linear in the grid values with these weights, so it
  cannot be computed without them, and shipping the grid values back instead would be 2^11 times the
  traffic at 2^10. A worker learning them adds nothing: it already computes this server's histogram
  share and check values, so a dishonest worker could shift them anyway (a server's own robustness
  rests on its machines, as in `round_one`'s argument for one per-task key). They are per task: the
  challenges' key, from which every task's challenges derive, stays on the server.
- never the pair key K (the report-set hashes, the channel's MAC, the challenges' key), the
  challenges' key `round_one.verification_key(K)`, nor the noise seed: nothing a worker gets opens a
  report or predicts a noise draw (tests/service/system/test_dask.py pickles every submitted argument
  and looks for them).
"""
from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import threading
from collections import OrderedDict, deque
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from fss import field as F

from ..files import write_secret
from ..protocols.check import round_one
from ..protocols.context import StepContext
from ..protocols.reconciliation.maths import SyncError
from ..task import MAX_VERIFIED_GRID

if TYPE_CHECKING:
    import distributed

# grid values per batch (a worker's task, several passes): 2^14 reports at 2^10 points, so the server's share
# of the work (Dask's per-task cost, a commit per batch) is small next to the workers'; above MAX_VERIFIED_GRID
# 512 reports of a 2^20 count task, so the stored column sums (a whole grid per batch) are 16 KiB a report
TASK_ELEMENTS, LARGE_TASK_ELEMENTS = 1 << 25, 1 << 30
AHEAD = 2  # batches in flight per worker: one running, one waiting, so no worker idles on the server's reads
_CHALLENGES = 4  # tasks whose challenges stay scattered on the workers


class RoundOneMap:
    """Round one of a task's unchecked reports on a Dask `client`'s workers (`__call__`); the same
    bits as `round_one.step` in a loop, in larger batches."""

    def __init__(self, client: "distributed.Client", worker_count: Callable[[], int], spool: Path | None = None):
        self.client, self.worker_count, self.spool = client, worker_count, spool
        self._challenges: OrderedDict[tuple[str, bytes], distributed.Future] = OrderedDict()
        self._guard = threading.Lock()  # tasks' round ones run in parallel (one lock per task, `round_one.lock`)

    def reports_per_batch(self, size: int, width: int) -> int:
        elements = TASK_ELEMENTS if size <= MAX_VERIFIED_GRID else LARGE_TASK_ELEMENTS
        return max(round_one.keys_per_pass(size, width), elements // (size * width))

    def __call__(self, ctx: StepContext) -> int:
        """Round one of every stored report of the task not yet in a batch; returns how many. While
        the collection is open and the grid is above MAX_VERIFIED_GRID, a last partial batch waits for
        more reports (each batch stores a whole grid of sums); the close takes it."""
        config, store = ctx.config, ctx.store
        dcf, check = config.key_dcf(), config.check()
        per = self.reports_per_batch(check.size, dcf.width)
        life = store.lifecycle(config.task_id)
        assert life is not None  # (a task being checked is stored)
        partial = check.size <= MAX_VERIFIED_GRID or not life.collecting
        ch, after, done, width = None, None, 0, dcf.key_size + 8 * check.extras
        pending: deque = deque()
        while True:
            while len(pending) < self._window():
                seqs, ids, shares, lengths = store.unchecked_joined(config.task_id, per, after)  # one object each
                n = len(shares) // width
                if not seqs or (n < per and not partial):
                    break
                if lengths != {width}:
                    raise SyncError("a stored share has the wrong length for this task")
                if ch is None:
                    ch = self._scattered(ctx, check)
                after = seqs[-1]
                args = (_round_one, dcf, check, ctx.party, shares, ch)
                pending.append((seqs, ids, args, self._submit(*args)))
                if n < per:
                    break
            if not pending:
                return done
            seqs, ids, args, future = pending.popleft()
            extras = np.ascontiguousarray(round_one.share_rows(dcf, check.extras, args[4])[:, dcf.key_size:]).view("<u8")
            round_one.store_batch(ctx, seqs, ids, (extras, *self._result(future, args)))
            done += len(extras)

    def _window(self) -> int:
        """Batches in flight at once (and in the spool): AHEAD per worker."""
        return AHEAD * max(1, self.worker_count())

    def _submit(self, work: Callable, dcf, check, party: int, shares: bytes, *rest) -> "distributed.Future":
        """`work(dcf, check, party, shares, *rest)` on a worker. With a `spool` (`local:N`: the
        workers are this machine's) the shares go in a file there (RAM, 0600) that the worker reads
        and deletes: Dask's comms cost the server 3 ms and the worker 4 ms of CPU per MB, over TLS or
        not (6.4 MB a batch at 2^10). Else they go to one worker first (`scatter`, round robin): in the
        task itself they went through the scheduler, so it decrypted and encrypted them once more."""
        data = None
        if self.spool is not None:
            data = _Spooled(str(self.spool / secrets.token_hex(16)), dcf.key_size + 8 * check.extras)
            try:
                write_secret(data.path, shares)
            except OSError:  # /dev/shm full: this batch by Dask's comms (write_secret left no partial file)
                data = None
        if data is None:
            data = self.client.scatter(shares, hash=False)
        return self.client.submit(_run, work, dcf, check, party, data, *rest, pure=False)

    def _result(self, future: "distributed.Future", args: tuple):
        """The batch's result; once more on the cluster if it failed (a worker died with the batch's
        shares, which only it held: the scheduler cannot rerun the task without them)."""
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - the second attempt's error is the one raised
            return self._submit(*args).result()

    def grid_sum(self, ctx: StepContext, ids: list[bytes]) -> np.ndarray:
        """`round_one.grid_sum` of these stored reports (the close's drops), a batch per worker task,
        the partial sums added here mod p: the same bits whatever the cut."""
        config = ctx.config
        dcf, check = config.key_dcf(), config.check()
        per = self.reports_per_batch(check.size, dcf.width)
        starts = deque(range(0, len(ids), per))
        pending: deque = deque()
        total = np.zeros((check.size, check.width), np.uint64)
        while starts or pending:  # at most AHEAD batches per worker in flight (and spooled), as __call__
            while starts and len(pending) < self._window():
                s = starts.popleft()
                args = (round_one.shares_grid_sum, dcf, check, ctx.party,
                        b"".join(ctx.store.shares_by_id(config.task_id, ids[s:s + per])))
                pending.append((args, self._submit(*args)))
            args, future = pending.popleft()
            total = F.add(total, self._result(future, args))
        return total

    def _scattered(self, ctx: StepContext, check):
        """The task's challenges on every worker, sent once per task (at 2^20 points they are 16 MiB)."""
        key = (ctx.config.task_id, ctx.config.fingerprint)
        with self._guard:
            held = self._challenges.get(key)
            if held is None or held.status != "finished":  # sent again once the workers that held them are gone
                # (a dead future failed every later batch with "lost dependencies" until the server restarted:
                # review of issue 24)
                ch = round_one.challenges(check, ctx.pair_key, ctx.config.task_id)
                self._challenges[key] = self.client.scatter(ch, broadcast=True, hash=False)
                while len(self._challenges) > _CHALLENGES:
                    self._challenges.popitem(last=False)
            self._challenges.move_to_end(key)
            return self._challenges[key]


def _round_one(dcf, check, party: int, shares: bytes, ch) -> tuple[np.ndarray, ...]:
    """`round_one.evaluate` without the extras, which the server cuts from the shares it sent (the
    same bytes): 45% of what a batch sends back at 2^10."""
    return round_one.evaluate(dcf, check, party, shares, ch)[1:]


class _Spooled:
    """A batch's shares (rows of `width` bytes) in a file of the server's spool, which the worker
    maps (RAM: no copy) and deletes."""

    def __init__(self, path: str, width: int):
        self.path, self.width = path, width

    def take(self) -> np.ndarray:
        with open(self.path, "rb") as f:
            rows = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8).reshape(-1, self.width)
        os.unlink(self.path)  # the mapping stays until the rows are dropped
        return rows


def _run(work, *args):
    """`work(*args)` on a worker: one kernel at a time, with the worker's threads."""
    args = tuple(a.take() if isinstance(a, _Spooled) else a for a in args)
    with kernel_threads():
        return work(*args)


_kernel_lock = threading.Lock()  # one kernel launch at a time per worker process (numba's thread pool)


@contextlib.contextmanager
def kernel_threads() -> Iterator[None]:
    """One kernel launch at a time in this worker process, with as many numba threads as it has Dask threads."""
    with _kernel_lock:
        threads = _threads()
        if threads:
            import numba

            cores = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # numba.config sets its options at import
            numba.set_num_threads(max(1, min(threads, cores)))
        yield


def _threads() -> int | None:
    try:
        from distributed import get_worker

        return get_worker().state.nthreads
    except (ImportError, ValueError, AttributeError):
        return None
