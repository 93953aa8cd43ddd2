"""POST /tasks (register), and for the analyst GET /tasks/{id} (status) and POST /tasks/{id}/close
(close the collection and relay the servers' reconciliation, `reconcile.step`)."""
from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Body

from ....errors import DpcdfError
from ... import reconcile
from ...hpke import public_key
from ...store import AlreadyAnswered
from ...task import TaskConfig
from ..deps import AnalystTaskDep, RawBody, ServerDep
from ..errors import HttpError
from ..models import CloseRequest, CloseResponse, TaskRegistered, TaskStatus, errors
from ..state import Server, TaskState, pair_key

router = APIRouter(prefix="/tasks", tags=["tasks"])

_CONFIG_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TaskSpec"}}}}}


@router.post("", status_code=201, response_model=TaskRegistered, responses=errors(400, 409), openapi_extra=_CONFIG_BODY)
def register(srv: ServerDep, raw: RawBody) -> TaskRegistered:
    """Registers a task: the config must name this server's HPKE key as its own and a valid key for
    the other server. Registering the same config again is a no-op; another one under its id is 409."""
    party = srv.party
    try:
        config = TaskConfig.from_json(raw)
    except DpcdfError as exc:
        raise HttpError(400, str(exc)) from None
    if config.hpke_keys[party] != srv.keys.public_hex(config.kem):
        raise HttpError(400, f"the task does not name this server's {config.kem} HPKE key as server {party}'s")
    try:  # the other server's key: clients seal to it, and the servers' shared key comes from it
        public_key(config.kem, config.hpke_keys[1 - party])
        pair_key(config, party, srv.keys)
    except (DpcdfError, ValueError) as exc:
        raise HttpError(400, f"server {1 - party}'s HPKE key in the task is not a {config.kem} key: {exc}") from None
    if srv.store.add_task(config.task_id, config.to_json(), config.fingerprint, secrets.token_bytes(32)) is not None:
        raise HttpError(409, f"task {config.task_id} exists with another configuration")
    return TaskRegistered(task_id=config.task_id, fingerprint=config.fingerprint.hex())


@router.get("/{task_id}", response_model=TaskStatus, responses=errors(401, 404))
def status(task_id: str, srv: ServerDep, st: AnalystTaskDep) -> TaskStatus:
    frozen = srv.store.frozen(task_id)
    n = frozen[1] if frozen else srv.store.count(task_id)
    return TaskStatus(task_id=task_id, reports=n if st.config.n_public else None, closed=frozen is not None,
                      min_batch=st.config.min_batch)


@router.post("/{task_id}/close", response_model=CloseResponse, responses=errors(400, 401, 403, 404, 409))
def close(srv: ServerDep, st: AnalystTaskDep, req: Annotated[CloseRequest | None, Body()] = None) -> CloseResponse:
    """Closes the collection (the first call), then plays this server's part of the reconciliation:
    the analyst relays each reply's `sync` to the other server (0, 1, 0, 1). A server drops its
    one-sided reports on the way and is reconciled (answers queries, shows its report-set hash)
    after its last message. Closes and queries run one at a time."""
    task_id, store = st.config.task_id, srv.store
    with srv.answering:
        if store.frozen(task_id) is None and store.count(task_id) < st.config.min_batch:
            raise HttpError(403, f"the task has {store.count(task_id)} reports; queries need at least {st.config.min_batch}")
        store.freeze(task_id, st.set_hash)
        try:
            move = reconcile.step(st.pair_key, st.config.fingerprint, srv.party, store.frozen_ids(task_id),
                                  req.sync if req else None)
        except reconcile.SyncError as exc:
            raise HttpError(400, str(exc)) from None
        except reconcile.TooManyDifferences as exc:
            raise HttpError(409, str(exc)) from None
        if move.drop:
            try:
                store.exclude(task_id, sorted(move.drop), st.set_hash)
            except AlreadyAnswered:
                raise HttpError(409, "the servers' report sets differ and this server has already answered: "
                                     "the task cannot be reconciled") from None
        if move.done:
            store.mark(task_id, "reconciled")
        return CloseResponse(party=srv.party, sync=move.reply, **reconciled_view(srv, st))


def reconciled_view(srv: Server, st: TaskState) -> dict:
    """n (when public) and the report-set hash, once this server is reconciled; before, nothing
    (an intermediate hash would show whether reconciliation dropped anything)."""
    if not srv.store.marked(st.config.task_id, "reconciled"):
        return {"n": None, "reports_hash": None, "reconciled": False}
    _, n, digest = srv.store.frozen(st.config.task_id)
    return {"n": n if st.config.n_public else None, "reports_hash": digest, "reconciled": True}
