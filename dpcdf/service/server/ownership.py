"""A data directory belongs to one server: the party its tasks name it, and one serving process at a time.

Why. The directory holds the server's HPKE keys and its store; every task config in the store names
those keys as one party's (server 0's or server 1's): that is the directory's party. Started as the
other party, the server would refuse every report of those tasks ("the share does not open with this
server's key") and every new task naming it in its place, with nothing to say why. Two processes
serving one directory would share one store and one key pair, so one machine would answer as both of
its addresses. Both are refused at the start instead, in one line.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import DpcdfError
from ..files import exclusive_lock

LOCK_FILE = "serve.lock"  # flock'd by the serving process


def claim_party(data: Path, party: int, task_configs, public_key: str) -> None:
    """Checks that `data` is server `party`'s: its tasks (`task_configs`, the store's configs as JSON)
    name this server's HPKE key (`public_key`, x25519, hex; a hybrid key ends with it) as one party's,
    the same in all of them, as registration checks. A directory with no task yet may start as either."""
    for text in task_configs:
        keys = [k.strip().lower()[-64:] for k in json.loads(text).get("hpke_keys", ())]
        if public_key.lower() in keys:
            named = keys.index(public_key.lower())
            if named != party:
                raise DpcdfError(f"{data} holds server {named}'s keys and store (its tasks name it as server {named}): "
                                 f"start it with --party {named}, or give server {party} a --data of its own")
            return


def hold(data: Path) -> int:
    """An exclusive lock on `data` for this process's life (the descriptor is returned and kept open);
    a DpcdfError if another process serves it."""
    fd = exclusive_lock(data / LOCK_FILE)
    if fd is None:
        raise DpcdfError(f"{data} is served by another dpcdf server already: each server needs a --data of its own "
                         "(stop the other one first to restart it)")
    return fd
