"""A reconciled task's key shares, kept for evaluation in the layout the kernels read.

Once a task is reconciled its report set is fixed, so its key shares are written once into
columnar segments under DATA/segments/<task>/: one `.npy` file per `KeyBatch` array (seeds,
cw_seed, cw_t, cw_v, in the grouped layout) per shard of `SHARD_KEYS` keys, each file's SHA-256
recorded in the store (`Store.record_segments`). Loading maps the files (`np.load(mmap_mode="c")`:
read-only pages shared with the page cache and with other processes mapping the same files, such
as Dask workers on the same machine or on a shared filesystem) and wraps them in a `KeyBatch`
without copying. Checksums are verified once, at load; a missing, corrupt or stale segment is
rebuilt from the store's rows, never used. SQLite stays the durable store of reports, ids and task
state: the segments can always be rebuilt from it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from fss import DCF, FssError, KeyBatch
from fss.keys import GROUP

from ...errors import DpcdfError
from ..files import private_dir
from .records import SegmentFile
from .store import Store

log = logging.getLogger("dpcdf.segments")

ARRAYS = ("seeds", "cw_seed", "cw_t", "cw_v")
SHARD_KEYS = 1 << 20  # keys per shard (a multiple of GROUP): about 10^6
_CHUNK = 16 << 20


class SegmentError(DpcdfError):
    """A segment file is missing, unreadable, or not what its recorded checksum says."""


@dataclass(frozen=True, eq=False)
class SegmentBatch(KeyBatch):
    """A `KeyBatch` whose arrays are mapped from segment files: `directory`, and `files` (the file
    names of seeds, cw_seed, cw_t and cw_v) and `digests` (their SHA-256), so that a distributed
    evaluator can send the files' names instead of the keys (`dpcdf.service.server.dask_eval`)."""

    directory: str = ""
    files: tuple[str, ...] = ()
    digests: tuple[str, ...] = ()


def task_dir(data_dir: str | Path, task_id: str) -> Path:
    """DATA/segments/<task_id> (a hash of the id if it is not a plain file name)."""
    name = task_id if re.fullmatch(r"[A-Za-z0-9_-]{1,128}", task_id) else hashlib.sha256(task_id.encode()).hexdigest()
    return Path(data_dir) / "segments" / name


class _Hashing:
    """A file writer that hashes what goes through it."""

    def __init__(self, f):
        self.f, self.h = f, hashlib.sha256()

    def write(self, data) -> int:
        self.h.update(data)
        return self.f.write(data)


def write(directory: str | Path, batches: Iterable[KeyBatch], set_hash: str) -> list[SegmentFile]:
    """Writes each batch as one shard (shard i: `i.<array>.npy`, written to a temporary name,
    fsynced, renamed); returns the files' records for `Store.record_segments`. Files of earlier
    segments in the directory are removed first."""
    directory = Path(directory)
    private_dir(directory.parent)  # DATA/segments, then the task's own: key shares, the owner's only
    private_dir(directory)
    for old in directory.glob("*.npy*"):
        old.unlink()
    records = []
    for shard, batch in enumerate(batches):
        for name in ARRAYS:
            file = f"{shard:05d}.{name}.npy"
            tmp = directory / (file + ".tmp")
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                out = _Hashing(f)
                np.lib.format.write_array(out, np.ascontiguousarray(getattr(batch, name)), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, directory / file)
            records.append(SegmentFile(shard, name, len(batch), file, out.h.hexdigest(), set_hash))
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return records


def sha256(path: Path) -> str:
    """The file's SHA-256, hex (what the store records for each segment file)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def open_array(path: str | Path) -> np.ndarray:
    """A segment file mapped copy-on-write: nothing is read until used, nothing is ever written back,
    and the array is writeable as numpy sees it (so the kernels take it as they take any batch)."""
    return np.load(path, mmap_mode="c", allow_pickle=False)


def load(directory: str | Path, files: Sequence[SegmentFile], dcf: DCF, party: int, verify: bool = True) -> list[SegmentBatch]:
    """The shards recorded in `files`, mapped from `directory`; with `verify`, each file's SHA-256
    is checked first. Raises SegmentError on a missing, corrupt or malformed file."""
    directory = Path(directory)
    shards: dict[int, dict[str, SegmentFile]] = {}
    for f in files:
        shards.setdefault(f.shard, {})[f.array] = f
    if sorted(shards) != list(range(len(shards))):
        raise SegmentError(f"the segments in {directory} are not numbered 0..{len(shards) - 1}")
    out = []
    for shard in range(len(shards)):
        recs = shards[shard]
        if set(recs) != set(ARRAYS) or len({r.n for r in recs.values()}) != 1:
            raise SegmentError(f"shard {shard} in {directory} does not record one of each array for one key count")
        arrays = []
        for name in ARRAYS:
            path = directory / recs[name].file
            try:
                if verify and sha256(path) != recs[name].sha256:
                    raise SegmentError(f"{path} does not match its recorded SHA-256")
                arrays.append(open_array(path))
            except (OSError, ValueError) as exc:
                raise SegmentError(f"cannot read the segment {path}: {exc}") from None
        try:
            batch = KeyBatch.from_grouped(dcf.params, party, recs["seeds"].n, *arrays)
        except FssError as exc:
            raise SegmentError(f"shard {shard} in {directory}: {exc}") from None
        out.append(SegmentBatch(batch.params, party, batch.n, *arrays, directory=str(directory),
                                files=tuple(recs[a].file for a in ARRAYS), digests=tuple(recs[a].sha256 for a in ARRAYS)))
    return out


def decode_shares(dcf: DCF, shares: Sequence[bytes], party: int) -> KeyBatch:
    """One batch from stored single-key encodings of `party` (checked on the way in, so only the
    headers are checked here), in one vectorized pass."""
    p = dcf.params
    n = len(shares)
    header = p.header(party)
    blob = b"".join(shares)
    if len(blob) != n * p.key_size:
        raise SegmentError(f"stored key shares are not {p.key_size}-byte keys of {p.describe()}")
    keys = np.frombuffer(blob, np.uint8).reshape(n, p.key_size)
    if n and not (keys[:, : len(header)] == np.frombuffer(header, np.uint8)).all():
        raise SegmentError(f"a stored key share is not a key of {p.describe()} for party {party}")
    body = p.header(party, batch=True) + n.to_bytes(8, "little") + keys[:, len(header):].tobytes()
    return dcf.batch_from_bytes(body, party)


def build(store: Store, task_id: str, dcf: DCF, party: int, directory: str | Path) -> list[SegmentBatch]:
    """Writes the reconciled task's key shares from the store's rows into segments (streamed, one
    shard at a time), records them, and maps them."""
    frozen = store.frozen(task_id)
    if frozen is None:
        raise SegmentError(f"task {task_id} is not closed")
    chunks = store.share_chunks(task_id, frozen.seq, SHARD_KEYS)
    files = write(directory, (decode_shares(dcf, chunk, party) for chunk in chunks), frozen.digest)
    if sum(f.n for f in files if f.array == ARRAYS[0]) != frozen.count:
        raise SegmentError(f"task {task_id}: the store's rows do not add up to its {frozen.count} reports")
    store.record_segments(task_id, files)
    return load(directory, files, dcf, party, verify=False)


def open_or_build(store: Store, task_id: str, dcf: DCF, party: int, data_dir: str | Path) -> list[SegmentBatch]:
    """The reconciled task's key shares: its recorded segments if they are there, whole and of its
    current report set (checksums verified), else rebuilt from the store."""
    directory = task_dir(data_dir, task_id)
    frozen = store.frozen(task_id)
    files = store.segments(task_id)
    if frozen is not None and files:
        if all(f.set_hash == frozen.digest for f in files) and sum(f.n for f in files if f.array == ARRAYS[0]) == frozen.count:
            try:
                return load(directory, files, dcf, party)
            except SegmentError as exc:
                log.warning("task %s: %s; rebuilding its segments from the store", task_id, exc)
        else:
            log.warning("task %s: its segments are of another report set; rebuilding them", task_id)
    return build(store, task_id, dcf, party, directory)


def group_ranges(batch: KeyBatch, pieces: int) -> list[tuple[int, int, int]]:
    """`batch` cut into at most `pieces` ranges of whole groups: (first group, end group, keys)."""
    g = batch.seeds.shape[0]
    pieces = max(1, min(pieces, g))
    cuts = [g * i // pieces for i in range(pieces + 1)]
    return [(a, b, min(batch.n, b * GROUP) - a * GROUP) for a, b in zip(cuts, cuts[1:]) if b > a]


def piece(batch: KeyBatch, first: int, end: int, n: int) -> KeyBatch:
    """Keys of groups [first, end) of `batch` (n of them) as a batch of views: nothing copied."""
    return KeyBatch.from_grouped(batch.params, batch.party, n, batch.seeds[first:end], batch.cw_seed[first:end],
                                 batch.cw_t[first:end], batch.cw_v[first:end])
