"""Registering a task on this server (POST /tasks, the operator's route; `routers.tasks` maps HTTP to
`register`): what a task's config must say of this server and of the other one before it is taken.

The config must name this server's HPKE key as its own (at its party's place) and a valid key of the same
kind for the other server: clients seal the other server's shares to that key, and the key the two
servers share for the task (`context.pair_key`) comes from it. A verified task beyond MAX_VERIFIED_GRID
points needs a Dask cluster reached over TLS. On server 0, server 1 must answer at its URL with the key
the task names for it (`peers.probe`: the direction of every server-to-server message is checked now,
not at the close). The same config again is a no-op; another one under its id is refused, and so is a
task expired or deleted here: its id stays taken and its noise seed gone (issue 24)."""
from __future__ import annotations

from ...errors import DpcdfError
from ..hpke import public_key
from ..task import MAX_VERIFIED_GRID, TaskConfig
from . import peers
from .context import pair_key
from .errors import HttpError
from .housekeeping import Retention
from .state import Server


def register(srv: Server, raw: bytes, retention: Retention) -> TaskConfig:
    """Registers the task of the JSON config `raw` on this server and returns its config: HttpError 400
    for a config that is not valid or not for this server, 409 for another config under a registered id
    or a task that is gone, and `peers.probe`'s 502 if server 1 cannot be reached as the task names it."""
    party = srv.party
    try:
        config = TaskConfig.from_json(raw)
    except DpcdfError as exc:
        raise HttpError(400, str(exc)) from None
    if config.hpke_keys[party] != srv.keys.public_hex(config.kem):
        swapped = config.hpke_keys[1 - party] == srv.keys.public_hex(config.kem)
        raise HttpError(400, f"the task does not name this server's {config.kem} HPKE key as server {party}'s"
                        + (f" (it names this server as server {1 - party}: list the servers in party order, server 0's "
                           "URL first)" if swapped else ""))
    try:  # the other server's key: clients seal to it, and the servers' shared key comes from it
        public_key(config.kem, config.hpke_keys[1 - party])
        pair_key(config, party, srv.keys)
    except (DpcdfError, ValueError) as exc:
        raise HttpError(400, f"server {1 - party}'s HPKE key in the task is not a {config.kem} key: {exc}") from None
    if config.verify and config.make_grid().size > MAX_VERIFIED_GRID and getattr(srv.evaluator, "round_one", None) is None:
        raise HttpError(400, f"a verified task of more than {MAX_VERIFIED_GRID} grid points needs a server with a "
                             "Dask cluster reached over TLS (dpcdf serve --dask local:N or tls://...): this one has "
                             "none; use verify=false")
    if party == 0 and srv.probe_peer:  # the direction of every server-to-server message: checked now, not at the close
        peers.probe(config)
    srv.register(config)
    gone = retention.gone(config.task_id)  # issue 24: its id stays taken, its seed gone
    if gone:
        raise HttpError(409, f"task {config.task_id} is {gone}: register a new task (a new id) instead")
    return config
