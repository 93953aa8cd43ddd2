"""A task's histogram share on this server, from which its queries are answered in O(grid) whatever n
is (issue 12 for verified tasks, issue 44 for unverified ones): its share of the number of reports
with index <= i at every grid index i.

- A verified task's is made at its close by the report check (`protocols.check.outcome.finish`), over
  the reports that passed, in F_p.
- An unverified task's, on grids of up to GRID_SUMS_MAX points, is made at its close too (`HistogramShare.get`
  on both servers before server 0's DONE, so before the analyst's close returns), mod 2^64: from the
  grid sums of its reports' batches (`protocols.grid_sums`, computed while they arrived, the rest
  caught up now), or on a server with a Dask evaluator by one pass of the cluster over the task's
  segments (`Aggregator.grid_histogram`). Either is the bits of evaluating the reconciled set's key
  shares at every grid index. Larger grids keep evaluating the key shares at each query.
Both are stored (`Store.save_histogram`) under the hash of the report set they count, and read back
once. An unverified task's that is missing (a crash between its reconciliation and the save, or a store
restored from a backup taken then) is made again where it is first needed, from what the store holds.
What it leaks: nothing new (`protocols.grid_sums`: a function of this server's own key shares).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from fss import KeyBatch

from ...errors import DpcdfError
from ..protocols import grid_sums
from .aggregate import Histogram
from .context import TaskContext


class HistogramShare:
    """The task's histogram share (`get`), kept in memory for its report set once read or made.
    `keys()` gives the frozen set's key shares (its segments), for a Dask evaluator's pass."""

    def __init__(self, ctx: TaskContext, keys: Callable[[], list[KeyBatch]]):
        self.ctx, self.keys = ctx, keys
        self._kept: Histogram | None = None

    @property
    def answers(self) -> bool:
        """Whether the task's queries read a histogram share: verified, or a grid of up to GRID_SUMS_MAX."""
        return self.ctx.config.verify or grid_sums.summed(self.ctx.config)

    def get(self) -> Histogram:
        """The share for the task's current (frozen, reconciled) report set: kept, stored, or for an
        unverified task made now and stored. DpcdfError for a verified task whose close has not stored it."""
        store, task_id = self.ctx.store, self.ctx.config.task_id
        frozen = store.frozen(task_id)
        if frozen is None:
            raise DpcdfError(f"task {task_id} has no report set yet: its collection is open")
        digest = frozen.digest
        if self._kept is not None and self._kept.set_hash == digest:
            return self._kept
        row = store.histogram(task_id)
        if row is not None and row[0] == digest:
            values = np.frombuffer(row[2], "<u8").astype(np.uint64).reshape(row[1])
        elif self.ctx.config.verify or not self.answers:
            raise DpcdfError(f"task {task_id} has no histogram of its {'verified ' if self.ctx.config.verify else ''}report set")
        else:
            values = self._make(digest)
        self._kept = Histogram(values, digest)
        return self._kept

    def _make(self, digest: str) -> np.ndarray:
        """An unverified task's share of its reconciled set, stored under `digest` (not for a task
        purged meanwhile: `Store.save_histogram`)."""
        agg, size = self.ctx.aggregator, self.ctx.grid.size
        if agg.evaluator is not None:  # --dask: the cluster's one pass over the segments (no batches here)
            values = agg.grid_histogram(self.keys(), size, digest).values
        else:
            values = grid_sums.histogram(self.ctx)
        self.ctx.store.save_histogram(self.ctx.config.task_id, digest, values.shape, values.astype("<u8").tobytes())
        return values
