"""A data directory belongs to one server: one party, for good, and one serving process at a time.

Why. The directory holds the server's HPKE keys and its store; every task config in the store names
those keys as one party's (server 0's or server 1's). Started as the other party, the server would
refuse every report of those tasks ("the share does not open with this server's key") and every new
task naming it in its place, with nothing to say why. Two processes serving one directory would
share one store and one key pair, so one machine would answer as both of its addresses. Both are
refused at the start instead, in one line.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import DpcdfError
from ..files import exclusive_lock, write_secret

PARTY_FILE = "party"  # "0" or "1", written at the first start
LOCK_FILE = "serve.lock"  # flock'd by the serving process


def claim_party(data: Path, party: int, task_configs, public_key: str) -> None:
    """Checks that `data` is server `party`'s and records it there. A directory of an earlier dpcdf
    (no party file) is known by its tasks: the party whose HPKE key in a task config is this
    server's (`public_key`, x25519, hex); `task_configs` yields the store's configs (JSON)."""
    path = data / PARTY_FILE
    if path.exists():
        recorded = path.read_text().strip()
    else:
        recorded = None
        for text in task_configs:
            keys = [k.strip().lower()[-64:] for k in json.loads(text).get("hpke_keys", ())]
            if public_key.lower() in keys:
                recorded = str(keys.index(public_key.lower()))
                break
    if recorded is not None and recorded != str(party):
        raise DpcdfError(f"{data} holds server {recorded}'s keys and store (its tasks name it as server {recorded}): "
                         f"start it with --party {recorded}, or give server {party} a --data of its own")
    if not path.exists():
        write_secret(path, f"{party}\n".encode())


def hold(data: Path) -> int:
    """An exclusive lock on `data` for this process's life (the descriptor is returned and kept open);
    a DpcdfError if another process serves it."""
    fd = exclusive_lock(data / LOCK_FILE)
    if fd is None:
        raise DpcdfError(f"{data} is served by another dpcdf server already: each server needs a --data of its own "
                         "(stop the other one first to restart it)")
    return fd
