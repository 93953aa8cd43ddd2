"""Files only their owner may read (0600): keys, tokens, stores and spools hold secrets or sealed
reports. Each is created with its mode, never chmod-ed after the fact (no moment readable by others)."""
from __future__ import annotations

import os
from pathlib import Path


def write_secret(path: str | Path, data: bytes) -> None:
    """Writes `data` to `path` (0600) atomically: a temporary file, fsync'd, then renamed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def create_private(path: str | Path) -> None:
    """Creates `path` empty with mode 0600 if it does not exist (before SQLite opens it)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
