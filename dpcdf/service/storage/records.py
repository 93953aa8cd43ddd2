"""What a server's store hands out and refuses: its errors, a task's milestones (`Mark`), and the
rows it returns (a closed task's report set, a journalled exchange step, a batch of the check's round
one, a segment file). The tables they come from are in `schema`, the queries in `store`."""
from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from ...errors import DpcdfError


class StoreError(DpcdfError):
    """Base class of the store's errors."""


class CollectionClosed(StoreError):
    """The task's collection is closed: its report set is fixed."""


class CollectionOpen(StoreError):
    """The task's collection is still open: it has no fixed report set yet."""


class AlreadyAnswered(StoreError):
    """The task has answered a query: its report set can no longer shrink."""


class UnknownTask(StoreError, KeyError):
    """No task with this id is stored."""


class Mark(str, Enum):
    """A task's milestones, in the order they are reached. FROZEN is set by `Store.freeze` (it fixes
    the report set); RECONCILED (both servers hold one set), VERIFIED (verified tasks: the reports'
    check is done and failures excluded) and ANSWERED (it answered a query) by `Store.mark`."""
    FROZEN = "frozen"
    RECONCILED = "reconciled"
    VERIFIED = "verified"
    ANSWERED = "answered"

    @classmethod
    def parse(cls, mark: Mark | str) -> Mark:
        try:
            return cls(mark)
        except ValueError:
            raise ValueError(f"unknown mark {mark!r}: one of {', '.join(repr(m.value) for m in cls)}") from None


class Frozen(NamedTuple):
    """A closed task's report set: the last report sequence number it includes, how many reports it
    has (excluded ones left out) and its hash (keyed: see protocols.reconciliation.maths)."""
    seq: int
    count: int  # type: ignore[assignment]  # (a field named as tuple.count, which it hides: its callers read .count)
    digest: str


class Exchange(NamedTuple):
    """One journalled step: the request's payload and the answer's payload (plaintext)."""
    request: bytes
    answer: bytes


class CheckBatch(NamedTuple):
    """One stored batch of round-one results (see CHECK_SCHEMA): n reports, arrays as bytes."""
    first_seq: int
    last_seq: int
    n: int
    ids: bytes
    message: bytes
    state: bytes
    extras: bytes
    sums: bytes


class SegmentFile(NamedTuple):
    """One array file of one shard of a task's segments: its shard number, array name, the shard's
    key count, its file name (relative to the task's segment directory), the file's SHA-256 (hex),
    and the hash of the report set the segments hold."""
    shard: int
    array: str
    n: int
    file: str
    sha256: str
    set_hash: str
