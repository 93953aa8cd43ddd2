"""A server's evaluation on a Dask cluster (`dask.distributed`): the map over key shards and the sum
of `aggregate.partial_sums`, spread over workers.

    evaluator = DaskEvaluator("tls://scheduler:8786")   # or "local:N": a LocalCluster of N processes
    Aggregator(dcf, mechanism, seed, task_id, evaluator=evaluator)

Each shard of a task's segments (`storage.segments`) is cut into pieces of whole key groups; a task per
piece evaluates `DCF.eval_sum` on that piece and the server adds the partial sums (mod 2^64, so the
result is bit-identical to the in-process one whatever the cut). Only public things go to the
cluster: key shares (the server's own, already stored in the segments), the DCF parameters and the
grid points. The noise seed stays on the server: `Aggregator` adds the noise after the sum.

How the keys reach the workers (`transport`):
- "path" (the default): a task names the segment files (path and SHA-256) and a range of groups;
  the worker maps the file (`np.load(mmap_mode="c")`, kept open between queries). The server's
  DATA/segments must be at the same path on every worker: the same machine, or a shared or network
  filesystem (NFS, a cluster filesystem) mounted at the same place. Nothing but names crosses the
  network, and pages come from the page cache.
- "scatter": each piece is sent once to one worker (`Client.scatter`) and kept there for later
  queries: no shared filesystem needed, at the cost of sending every key once and holding it in the
  workers' memory.

A worker evaluates one piece at a time with as many kernel threads as it has Dask threads
(`dask worker --nthreads T`; "local:N" starts N single-threaded workers, one per core).
Verified tasks' round one runs on the same cluster (`round_one` here, `dask_check.RoundOneMap`).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

import numpy as np

from fss import DCF, KeyBatch

from ...errors import DpcdfError
from ..storage import segments
from .dask_check import RoundOneMap, kernel_threads

GROUPS_PER_PIECE = 1 << 15  # at most 2^19 keys per task
# local:N has no dashboard, so nothing reads the workers' task profiles or the system monitor's history, and the
# event loops' latency ticks (every 20 ms in each of scheduler, nannies, workers) and memory checks need not be so
# frequent: they took CPU from the kernels on the same cores (idle local:2, Zen 3 class: 4.5% of a core per worker)
_QUIET = {"distributed.worker.profile.enabled": False, "distributed.admin.system-monitor.interval": "2s",
          "distributed.admin.system-monitor.disk": False, "distributed.admin.system-monitor.gil.enabled": False,
          "distributed.admin.tick.interval": "500ms", "distributed.worker.memory.monitor-interval": "500ms"}
TRANSPORTS = ("path", "scatter")


class DaskError(DpcdfError):
    """The Dask cluster cannot be reached or used, or an address is malformed or refused."""


ENCRYPTED = ("tls://", "local:")  # schemes taken without --dask-insecure (local:N runs mutual TLS, below)


def check_address(address: str, insecure: bool = False) -> None:
    """Refuses a scheduler address this server must not use (DaskError). A Dask cluster is part of the
    server (issue 42): its workers map the server's key shares, and the server unpickles what they send
    back, so whoever reaches the scheduler runs code on those workers and, through a result, in the
    server itself (its HPKE key, its noise seeds). Over plain TCP (tcp://, ws://, ucx://,
    ...) that is anyone on the network path: refused unless `insecure` (`--dask-insecure`) says the
    network is the operator's own. tls:// (with the certificates of Dask's configuration) and local:N
    are taken."""
    if "://" not in address and not address.startswith("local:"):
        raise DaskError(f"--dask takes a scheduler address (tls://host:8786) or local:N, got {address!r}")
    if not address.startswith(ENCRYPTED) and not insecure:
        raise DaskError(f"--dask {address}: refused, not encrypted: anyone who reaches a plain scheduler runs code on "
                        "the workers, which map this server's key shares, and in this server (it unpickles their results); "
                        "use a tls:// scheduler (certificates in Dask's configuration, docs/scaling.md) or local:N, or "
                        "add --dask-insecure if only you can reach that scheduler")


class DaskEvaluator:
    """`aggregate.Evaluator` on a Dask cluster: `address` is a scheduler's ("tls://host:8786"; a plain
    one such as "tcp://host:8786" only with `insecure`, `check_address`) or "local:N" for a LocalCluster
    of N single-threaded worker processes on this machine."""

    def __init__(self, address: str, transport: str = "path", timeout: float = 60.0, insecure: bool = False):
        check_address(address, insecure)  # before anything is imported or reached
        try:
            import dask
            from distributed import Client, LocalCluster
        except ImportError:
            raise DaskError("--dask needs dask.distributed: pip install 'fss-dpcdf[dask]'") from None
        if transport not in TRANSPORTS:
            raise DaskError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.address, self.transport = address, transport
        self.cluster = None
        self._scattered: dict[tuple, tuple[object, KeyBatch]] = {}  # piece -> (its future on a worker, its shard)
        if address.startswith("local:"):
            count = address[len("local:"):]
            if not count.isdigit() or not 1 <= int(count) <= 1024:
                raise DaskError(f"--dask local:N needs a worker count N >= 1, got {address!r}")
            from distributed.security import Security

            security = Security.temporary()  # mutual TLS with a throwaway CA: no one else on the machine connects
            with dask.config.set(_QUIET):
                self.cluster = LocalCluster(n_workers=int(count), threads_per_worker=1, processes=True, protocol="tls://",
                                            security=security, dashboard_address=None, silence_logs=40)
            # direct_to_workers: scattered batches and results go between this process and a worker (over the same
            # TLS), not through the scheduler's copy (`dask_check.RoundOneMap._submit`)
            self.client = Client(self.cluster, security=security, timeout=timeout, direct_to_workers=True)
        else:
            try:
                self.client = Client(address, timeout=timeout)
            except (OSError, TimeoutError) as exc:
                raise DaskError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
            except TypeError as exc:  # tls:// without Dask's TLS settings (review of issue 42): say what is missing
                raise DaskError(f"--dask {address}: Dask has no TLS settings for it ({exc}); set the client's "
                                "certificates in Dask's configuration (docs/scaling.md)") from None
        self.client.run(_warm_up)  # the workers load the kernels now, not at the first query
        # verified tasks' round one: only over TLS (local:N, or tls:// with the certificates of Dask's config).
        # Its workers hold the task's check challenges, with which a client forges reports that pass the
        # check: anyone who reaches a plain tcp:// scheduler could read them (review of issue 24)
        encrypted = self.cluster is not None or address.startswith("tls://")
        self.spool = _spool() if self.cluster is not None else None  # local:N: its workers read files of this machine
        self.round_one = RoundOneMap(self.client, lambda: len(self.workers()), self.spool) if encrypted else None

    def workers(self) -> list[str]:
        return sorted(self.client.scheduler_info()["workers"])

    def __call__(self, dcf: DCF, shards: list[KeyBatch], points: np.ndarray) -> np.ndarray:
        """sum over shards of dcf.eval_sum(shard, points), mod 2^out_bits: `partial_sums`' result."""
        points = np.asarray(points, np.int64)
        futures = [self.client.submit(_piece_sum, dcf, shard.party, source, points, pure=False)
                   for shard, source in self._sources(shards)]
        total = np.zeros((points.size,) + ((dcf.width,) if dcf.width > 1 else ()), np.uint64)
        for part in self.client.gather(futures):
            total += part
        return total & np.uint64(dcf.params.mask)

    def _sources(self, shards: list[KeyBatch]):
        """(shard, what a task needs to find its piece) for every piece of every shard."""
        live = [s for s in shards if len(s)]
        total = sum(s.seeds.shape[0] for s in live)
        want = max(2 * max(1, len(self.workers())), -(-total // GROUPS_PER_PIECE))
        for shard in live:
            pieces = max(1, round(want * shard.seeds.shape[0] / total))
            for first, end, n in segments.group_ranges(shard, pieces):
                if self.transport == "path" and isinstance(shard, segments.SegmentBatch):
                    yield shard, ("path", shard.directory, shard.files, shard.digests, first, end, n)
                else:
                    yield shard, ("data", self._scatter(shard, first, end, n))

    def _scatter(self, shard: KeyBatch, first: int, end: int, n: int):
        """The piece's arrays on one worker, sent once (kept for later queries)."""
        key: tuple = (shard.directory, shard.digests) if isinstance(shard, segments.SegmentBatch) else (id(shard),)
        key += (first, end)
        if key not in self._scattered:
            arrays = tuple(np.asarray(getattr(shard, a)[first:end]) for a in segments.ARRAYS)
            workers = self.workers()
            target = workers[len(self._scattered) % len(workers)]
            self._scattered[key] = (self.client.scatter([_Piece(n, arrays)], workers=[target])[0], shard)
        return self._scattered[key][0]

    def forget(self) -> None:
        """Drops the pieces sent by scatter (the workers free them)."""
        self._scattered.clear()

    def close(self) -> None:
        self.forget()
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        if self.spool is not None:  # batches a worker never took (it died first)
            _release(self.spool)


SPOOL_PREFIX = "dpcdf-round-one-"
SPOOL_LOCK = ".lock"  # held (flock) by the server that made the spool, for its whole life


def _spool(root: str = "/dev/shm") -> Path | None:
    """A folder only this user may enter (0700) in RAM (/dev/shm), for round one's batches of key
    shares on their way to a local worker; None without /dev/shm (then they go by Dask's comms:
    key shares are never left in a file on disk, which retention's secure delete would not reach).
    The server holds an flock on its `.lock` while it lives: the spools of servers that died without
    closing (their shares, which a later purge would not reach) are removed here, as their lock is
    free; a live server's lock is held (whatever its pid namespace), and anything else in /dev/shm
    (links, other users' folders, entries that vanish) is left alone."""
    if not os.path.isdir(root):
        return None
    for old in Path(root).glob(SPOOL_PREFIX + "*"):
        _remove_if_dead(old)
    made = Path(tempfile.mkdtemp(prefix="." + SPOOL_PREFIX, dir=root))  # not swept: no spool name yet
    fd = os.open(made / SPOOL_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    spool = made.with_name(made.name[1:])
    os.rename(made, spool)  # locked before a sweep can see it
    _held_locks[spool] = fd  # released at close, or when the process ends, however it ends
    return spool


def _release(spool: Path) -> None:
    shutil.rmtree(spool, ignore_errors=True)
    fd = _held_locks.pop(spool, None)
    if fd is not None:
        os.close(fd)


_held_locks: dict[Path, int] = {}


def _remove_if_dead(old: Path) -> None:
    try:
        st = old.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return  # a link, a file, another user's: not ours to judge
        fd = os.open(old / SPOOL_LOCK, os.O_RDWR | os.O_NOFOLLOW)
    except (OSError, ValueError):
        return  # gone meanwhile, or no lock (not a spool of this release)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # held: a live server's
    finally:
        os.close(fd)
    shutil.rmtree(old, ignore_errors=True)


class _Piece:
    """A piece's key count and grouped arrays, as scattered to a worker."""

    def __init__(self, n: int, arrays: tuple):
        self.n, self.arrays = n, arrays


# --- on the workers ---------------------------------------------------------------------------
_open: dict[tuple[str, str], np.ndarray] = {}
_MAX_OPEN = 512


def _mapped(directory: str, file: str, digest: str) -> np.ndarray:
    key = (str(Path(directory) / file), digest)  # the digest names the content: a rebuilt file is a new entry
    if key not in _open:
        if len(_open) >= _MAX_OPEN:
            _open.clear()
        if segments.sha256(Path(key[0])) != digest:  # a file swapped or changed since the server checked it
            raise segments.SegmentError(f"{key[0]} is not the segment the server recorded (checksum differs)")
        _open[key] = segments.open_array(key[0])
    return _open[key]


def _warm_up() -> None:
    from fss import backend

    backend.warm_up()  # round one's kernels load at a worker's first batch: only --dask servers with verified tasks pay


def _piece_sum(dcf: DCF, party: int, source: tuple, points: np.ndarray) -> np.ndarray:
    """One piece's `eval_sum` at `points`, on a worker."""
    if source[0] == "path":
        _, directory, files, digests, first, end, n = source
        arrays = [_mapped(directory, f, d)[first:end] for f, d in zip(files, digests)]
    else:
        piece = source[1]
        n, arrays = piece.n, list(piece.arrays)
    batch = KeyBatch.from_grouped(dcf.params, party, n, *arrays)
    with kernel_threads():
        return dcf.eval_sum(batch, points)
