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
import io
import logging
import math
import os
import queue
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from fss import DCF, FssError, KeyBatch, layout

from ...errors import DpcdfError
from ..files import fsync_dir, private_dir
from .records import SegmentFile
from .store import Store

log = logging.getLogger("dpcdf.segments")

ARRAYS = layout.ARRAYS  # a shard's files, one per grouped array of its `KeyBatch`
SHARD_KEYS = 1 << 20  # keys per shard (a multiple of layout.GROUP): about 10^6
BLOCK_KEYS = 1 << 15  # keys read, decoded and written at a time by `build` (divides SHARD_KEYS; a multiple of layout.GROUP)


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


def _npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The .npy header `np.lib.format.write_array` writes for a C-ordered array of this shape."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                                               "shape": tuple(int(d) for d in shape)})
    return out.getvalue()


def _prepare(directory: Path) -> None:
    private_dir(directory.parent)  # DATA/segments, then the task's own: key shares, the owner's only
    private_dir(directory)
    for old in directory.glob("*.npy*"):
        old.unlink()


class _Shard:
    """One shard's four files, written front to back as blocks of whole groups arrive: each to a
    temporary name, hashed on the way, fsynced and renamed at `close` (a crash before leaves only
    temporary names, which no record names)."""

    def __init__(self, directory: Path, shard: int, p: layout.Function, n: int):
        self.directory, self.shard, self.n = directory, shard, n
        self.shapes = layout.grouped_shapes(p, n)
        self.files, self.hashes, self.groups = {}, {}, 0
        try:
            for name, (shape, dtype) in self.shapes.items():
                tmp = directory / f"{shard:05d}.{name}.npy.tmp"
                self.files[name] = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
                self.hashes[name] = hashlib.sha256()
                self._put(name, _npy_header(shape, dtype))
        except BaseException:
            self.abort()
            raise

    def _put(self, name: str, data) -> None:
        self.hashes[name].update(data)  # SHA-256 and the write release the GIL on large buffers
        self.files[name].write(data)

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        """The next groups of each array (C-contiguous, grouped layout)."""
        for name, a in arrays.items():
            self._put(name, a.data.cast("B"))
        self.groups += arrays["seeds"].shape[0]

    def close(self) -> list[SegmentFile]:
        """fsyncs and renames the four files; returns their records (without the set hash)."""
        if self.groups != layout.groups(self.n):
            raise SegmentError(f"shard {self.shard}: {self.groups} groups of keys written, {layout.groups(self.n)} expected")
        records = []
        for name, f in self.files.items():
            f.flush()
            os.fsync(f.fileno())
            f.close()
            file = f"{self.shard:05d}.{name}.npy"
            os.replace(self.directory / (file + ".tmp"), self.directory / file)
            records.append(SegmentFile(self.shard, name, self.n, file, self.hashes[name].hexdigest(), ""))
        return records

    def abort(self) -> None:
        for name, f in self.files.items():
            f.close()
            (self.directory / f"{self.shard:05d}.{name}.npy.tmp").unlink(missing_ok=True)


def write(directory: str | Path, batches: Iterable[KeyBatch], set_hash: str) -> list[SegmentFile]:
    """Writes each batch as one shard (shard i: `i.<array>.npy`, each array with one write, to a
    temporary name, fsynced, renamed); returns the files' records for `Store.record_segments`.
    Files of earlier segments in the directory are removed first."""
    directory = Path(directory)
    _prepare(directory)
    records = []
    for shard, batch in enumerate(batches):
        out = _Shard(directory, shard, batch.params, len(batch))
        try:
            out.add({name: np.ascontiguousarray(getattr(batch, name)) for name in ARRAYS})
            records += [r._replace(set_hash=set_hash) for r in out.close()]
        except BaseException:
            out.abort()
            raise
    fsync_dir(directory)
    return records


def sha256(path: Path) -> str:
    """The file's SHA-256, hex (what the store records for each segment file), read 1 MiB at a time
    (hashlib.file_digest is Python 3.11's; this package supports 3.10)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


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
        seeds, cw_seed, cw_t, cw_v = arrays
        out.append(SegmentBatch(batch.params, party, batch.n, seeds, cw_seed, cw_t, cw_v, directory=str(directory),
                                files=tuple(recs[a].file for a in ARRAYS), digests=tuple(recs[a].sha256 for a in ARRAYS)))
    return out


def decode_block(dcf: DCF, party: int, n: int, blob: bytes) -> dict[str, np.ndarray]:
    """n stored single-key encodings of `party`, end to end, as the grouped arrays of a batch (the last
    group zero-padded, as `KeyBatch` pads it), in one vectorized pass over the bytes where they lie
    (`fss.layout.batch_from_rows`). Each key was checked when its report was taken; the decode checks
    them again (headers, reserved and padding bits), so a corrupt store row is a SegmentError, never a key."""
    if len(blob) != n * dcf.key_size:
        raise SegmentError(f"stored key shares are not {dcf.key_size}-byte keys of {dcf}")
    try:
        batch = layout.batch_from_rows(dcf, blob, party)
    except FssError as exc:
        raise SegmentError(f"a stored key share does not decode: {exc}") from None
    return {name: getattr(batch, name) for name in ARRAYS}


def build(store: Store, task_id: str, dcf: DCF, party: int, directory: str | Path) -> list[SegmentBatch]:
    """Writes the reconciled task's key shares from the store's rows into segments, records them, and
    maps them. One pass, in blocks of BLOCK_KEYS keys: a block is read (`Store.share_blocks`),
    decoded into the grouped arrays (`decode_block`) and appended to its shard's four files, so
    memory stays at a few blocks whatever the task's size; the files are fsynced and renamed once
    each, at the end of their shard. The store is read by a second thread, one block ahead of the
    decoding and writing (SQLite and the hashing, copies and writes release the GIL)."""
    frozen = store.frozen(task_id)
    if frozen is None:
        raise SegmentError(f"task {task_id} is not closed")
    directory = Path(directory)
    _prepare(directory)
    count = frozen.count
    block = math.gcd(BLOCK_KEYS, SHARD_KEYS)  # BLOCK_KEYS unless a test made the shards smaller
    records: list[SegmentFile] = []
    shard: _Shard | None = None
    done = 0
    try:
        for n, blob in _ahead(_blocks(store.share_blocks(task_id, frozen.seq, block, dcf.key_size), dcf.key_size, block)):
            if done + n > count:
                raise SegmentError(f"task {task_id}: the store has more rows than its {count} reports")
            if shard is None:
                shard = _Shard(directory, len(records) // len(ARRAYS), dcf, min(SHARD_KEYS, count - done))
            shard.add(decode_block(dcf, party, n, blob))
            done += n
            if done % SHARD_KEYS == 0 or done == count:
                records += [r._replace(set_hash=frozen.digest) for r in shard.close()]
                shard = None
    except BaseException:
        if shard is not None:
            shard.abort()
        raise
    if done != count:
        raise SegmentError(f"task {task_id}: the store's rows do not add up to its {count} reports")
    fsync_dir(directory)
    store.record_segments(task_id, records)
    return load(directory, records, dcf, party, verify=False)


def _blocks(chunks: Iterable[tuple[int, bytes]], key_size: int, size: int) -> Iterator[tuple[int, bytes]]:
    """The store's chunks re-cut into blocks of exactly `size` keys (the last one shorter), so that
    blocks never straddle a shard (`size` divides SHARD_KEYS) and only the last one pads its group.
    A chunk of exactly `size` keys (the usual one) passes through uncopied."""
    pending: list[bytes] = []
    have = 0
    for n, blob in chunks:
        if not have and n == size:
            yield n, blob
            continue
        pending.append(blob)
        have += n
        if have >= size:
            joined = b"".join(pending)
            cut = 0
            while have - cut >= size:
                yield size, joined[cut * key_size:(cut + size) * key_size]
                cut += size
            pending, have = ([joined[cut * key_size:]] if have > cut else []), have - cut
    if have:
        yield have, b"".join(pending)


def _ahead(items: Iterable[tuple[int, bytes]], depth: int = 2) -> Iterator[tuple[int, bytes]]:
    """`items`, produced by a second thread up to `depth` ahead; its exception is raised here, in order."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put(item)
            q.put(end)
        except BaseException as exc:  # handed to the consumer
            q.put(exc)

    thread = threading.Thread(target=produce, name="segments-read", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass
        thread.join()


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
    g, size = batch.seeds.shape[0], layout.GROUP
    pieces = max(1, min(pieces, g))
    cuts = [g * i // pieces for i in range(pieces + 1)]
    return [(a, b, min(batch.n, b * size) - a * size) for a, b in zip(cuts, cuts[1:]) if b > a]


def piece(batch: KeyBatch, first: int, end: int, n: int) -> KeyBatch:
    """Keys of groups [first, end) of `batch` (n of them) as a batch of views: nothing copied."""
    return KeyBatch.from_grouped(batch.params, batch.party, n, batch.seeds[first:end], batch.cw_seed[first:end],
                                 batch.cw_t[first:end], batch.cw_v[first:end])
