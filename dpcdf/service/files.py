"""Files only their owner may read (0600) in folders only their owner may enter (0700): keys, tokens,
stores, spools and key-share segments hold secrets or sealed reports. Each file is created with its
mode, never chmod-ed after the fact (no moment readable by others); a server's folders are made 0700
(`private_dir`), and its data directory narrowed to 0700 at start if it was wider. Also what `dpcdf task`
writes, read back (the task config, `TaskConfig.from_file`, and the analyst token beside it, `read_token`), by the
CLI and `Analyst.from_task_file` alike, each mistake a `TaskFileError` naming the file."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..errors import ParameterError


def write_secret(path: str | Path, data: bytes) -> None:
    """Writes `data` to `path` (0600) atomically: a temporary file, fsync'd, then renamed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a partial secret is not left behind (a full disk, /dev/shm)
        raise


def create_private(path: str | Path) -> None:
    """Creates `path` empty with mode 0600 if it does not exist (before SQLite opens it)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def private_dir(path: str | Path) -> Path:
    """`path` as a folder only its owner may enter (0700): created so (with its missing parents), or
    narrowed to 0700 if it exists with more."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def fsync_dir(path: str | Path) -> None:
    """Makes the directory's entries durable (new, renamed or removed files): fsync on the directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exclusive_lock(path: str | Path) -> int | None:
    """An exclusive, non-blocking flock on `path` (made 0600 if missing): its descriptor, held until
    closed (the kernel releases it when the process dies, however), or None if another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class TaskFileError(ParameterError):
    """A task or token file that is missing, unreadable, empty, or not a task config."""


def read_text(path: str | Path, what: str) -> str:
    """The text of `path`, `what` naming it in the error (e.g. "task file")."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise TaskFileError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise TaskFileError(f"{what} {path} is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def token_path(task_path: str | Path, token_file: str | Path | None = None) -> str:
    """Where the analyst token of the task at `task_path` is: `token_file`, else TASK.token beside it."""
    return str(token_file) if token_file is not None else f"{task_path}.token"


def read_token(path: str | Path) -> str:
    """The analyst token in the file at `path` (surrounding whitespace dropped)."""
    token = read_text(path, "analyst token file").strip()
    if not token:
        raise TaskFileError(f"analyst token file {path} is empty")
    return token
