"""What the command line reads from the user: the --grid spec, task files, and the values (and
labels) in a CSV column. Every mistake is a `CliError` naming the flag, or the file and line."""
from __future__ import annotations

import csv
import math

from .errors import DpcdfError
from .service.files import read_text


class CliError(DpcdfError):
    """A mistake on the command line or in its input files."""


def parse_grid(spec: str) -> dict:
    """uniform:LO:HI:BITS, log:LO:HI:BITS, integers:LO:HI (a threshold on every integer from LO to HI:
    integer data such as ages, answered exactly at each integer) or thresholds:T1,T2,..."""
    usage = (f"--grid must be uniform:LO:HI:BITS, log:LO:HI:BITS, integers:LO:HI or thresholds:T1,T2,... "
             f"(e.g. uniform:0:100:10, integers:18:90), got {spec!r}")
    kind, _, rest = spec.partition(":")
    try:
        if kind == "integers":
            lo, hi = (int(v) for v in rest.split(":"))
            if not lo < hi or hi - lo >= 1 << 24:
                raise CliError(f"--grid {spec}: LO must be below HI, at most 2^24 integers")
            return {"kind": "thresholds", "values": [float(v) for v in range(lo, hi + 1)]}
        if kind in ("uniform", "log"):
            lo_s, hi_s, bits_s = rest.split(":")
            low, high, bits = float(lo_s), float(hi_s), int(bits_s)
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise CliError(f"--grid {spec}: LO must be below HI, both finite")
            if not 1 <= bits <= 24:
                raise CliError(f"--grid {spec}: BITS must be in 1..24 (2^BITS thresholds)")
            return {"kind": kind, "lo": low, "hi": high, "bits": bits}
        if kind == "thresholds":
            values = [float(v) for v in rest.split(",")]
            if not values or not all(math.isfinite(v) for v in values):
                raise ValueError
            return {"kind": kind, "values": values}
    except ValueError:
        raise CliError(usage) from None
    raise CliError(usage)


def load_task(path: str):
    """`TaskConfig.from_file`, imported here at first use (the CLI starts without numpy)."""
    from .service.task import TaskConfig

    return TaskConfig.from_file(path)


def read_number(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise CliError(f"{where}: {text.strip()!r} is not a number") from None
    if not math.isfinite(v):
        raise CliError(f"{where}: {text.strip()!r} is not a finite number")
    return v


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_csv(path: str, column: str | None, label_column: str | None = None):
    """(values, labels or None, row contents, line numbers) from a CSV with a header row. The value
    column must be named when the file has more than one column; every cell must be a finite number."""
    text = read_text(path, "input").removeprefix("\ufeff")  # the byte-order mark spreadsheet exports begin with
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise CliError(f"{path} is empty: it needs a header row naming its columns, then one row per value")
    header = [h.strip() for h in rows[0]]
    if column is None:
        if len(header) != 1:
            raise CliError(f"{path} has {len(header)} columns ({', '.join(header)}): name the values' column "
                           "with --column")
        if _is_number(header[0]):  # no header: its first value would be taken for one, and lost
            raise CliError(f"{path} line 1 holds {header[0]!r}, a value, where the header naming the column belongs: "
                           "add a header line (e.g. 'value'), or name the column with --column if it is called that")
        column = header[0]
    cols = {}
    for name, flag in ((column, "--column"), (label_column, "--label-column")):
        if name is None:
            continue
        if name not in header:
            raise CliError(f"{path} has no column {name!r} ({flag}); its columns: {', '.join(header)}")
        if header.count(name) > 1:
            at = [str(i + 1) for i, h in enumerate(header) if h == name]
            raise CliError(f"{path} has {len(at)} columns named {name!r} (columns {', '.join(at)}; {flag}): rename "
                           "all but one, so that it is clear which holds the values")
        cols[flag] = header.index(name)
    values, labels, contents, lines = [], [], [], []
    for line, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise CliError(f"{path} line {line}: {len(row)} fields, the header has {len(header)}")
        values.append(read_number(row[cols["--column"]], f"{path} line {line}, column {column}"))
        if label_column is not None:
            cell = row[cols["--label-column"]].strip()
            if cell not in ("0", "1", "0.0", "1.0"):
                raise CliError(f"{path} line {line}, column {label_column}: a label is 0 or 1, got {cell!r}")
            labels.append(int(float(cell)))
        contents.append("\x1f".join(row).encode())
        lines.append(line)
    if not values:
        raise CliError(f"{path} has no rows of values under its header")
    return values, (labels if label_column is not None else None), contents, lines


# --- the commands ---------------------------------------------------------------------------------
