"""What `dpcdf task` writes, read back: the task config (TASK, JSON) and the analyst token beside it
(TASK.token, or a file named apart). The CLI and `Analyst.from_task_file` read them the same way, and
every mistake is a `TaskFileError` naming the file. Only pathlib at import (the CLI starts fast)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DpcdfError, ParameterError

if TYPE_CHECKING:
    from .task import TaskConfig


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


def load_task(path: str | Path) -> "TaskConfig":
    """The `TaskConfig` in the task file at `path`."""
    from .task import TaskConfig  # (numpy and the release: only where a task is read)

    text = read_text(path, "task file")
    try:
        return TaskConfig.from_json(text)
    except DpcdfError as exc:
        raise TaskFileError(f"task file {path} is not a task config: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise TaskFileError(f"task file {path} is not a task config ({exc.__class__.__name__}: {exc})") from None


def token_path(task_path: str | Path, token_file: str | Path | None = None) -> str:
    """Where the analyst token of the task at `task_path` is: `token_file`, else TASK.token beside it."""
    return str(token_file) if token_file is not None else f"{task_path}.token"


def read_token(path: str | Path) -> str:
    """The analyst token in the file at `path` (surrounding whitespace dropped)."""
    token = read_text(path, "analyst token file").strip()
    if not token:
        raise TaskFileError(f"analyst token file {path} is empty")
    return token
