"""POST /tasks/{id}/reports (one report) and /tasks/{id}/reports/batch (`wire.encode_batch`): binary
bodies. A report is acknowledged only once its key share is committed; a malformed, truncated,
wrongly sealed, foreign or duplicate one is refused with its reason and not stored."""
from __future__ import annotations

from fastapi import APIRouter

from fss import FssError

from ...store import CollectionClosed
from ...wire import Report, ReportError, decode_batch, open_share, split_share
from ..deps import RawBody, ServerDep, TaskDep
from ..errors import HttpError
from ..models import Accepted, BatchAccepted, Rejected, errors
from ..state import Server, TaskState

router = APIRouter(prefix="/tasks/{task_id}/reports", tags=["reports"])

CLOSED = "collection is closed: the analyst has closed the task"


def _binary(what: str) -> dict:
    schema = {"type": "string", "format": "binary", "description": what}
    return {"requestBody": {"required": True, "content": {"application/octet-stream": {"schema": schema}}}}


@router.post("", status_code=201, response_model=Accepted, responses=errors(400, 404, 409, 413),
             openapi_extra=_binary("one report (`wire.Report.to_bytes`)"))
def upload(task_id: str, srv: ServerDep, st: TaskDep, raw: RawBody) -> Accepted:
    good, rejected = accept(srv, st, [raw])
    if rejected:
        raise HttpError(400, rejected[0].error)
    try:
        added = srv.store.add_reports(task_id, good)[0]
    except CollectionClosed:
        raise HttpError(409, CLOSED) from None
    if not added:
        raise HttpError(409, "duplicate report id: already stored and counted once")
    if st.config.verify:
        srv.checker.wake(task_id)
    return Accepted()


@router.post("/batch", response_model=BatchAccepted, responses=errors(400, 404, 409, 413),
             openapi_extra=_binary("reports in one batch (`wire.encode_batch`)"))
def upload_batch(task_id: str, srv: ServerDep, st: TaskDep, raw: RawBody) -> BatchAccepted:
    """Stores the good reports of the batch; names each refused one by its index."""
    try:
        raws = decode_batch(raw)
    except ReportError as exc:
        raise HttpError(400, str(exc)) from None
    good, rejected = accept(srv, st, raws)
    try:
        added = srv.store.add_many(task_id, good) if good else 0
    except CollectionClosed:
        raise HttpError(409, CLOSED) from None
    if added and st.config.verify:
        srv.checker.wake(task_id)  # round one of these reports now, not at the close
    return BatchAccepted(accepted=added, duplicates=len(good) - added, rejected=rejected)


def accept(srv: Server, st: TaskState, raws: list[bytes]) -> tuple[list[tuple[bytes, bytes]], list[Rejected]]:
    """Parses and opens each report and checks that its share is a key of this task's DCF for
    this server (one vectorized decode for the whole batch; per key only to name a bad one)."""
    opened, rejected = [], []
    party, fp, kem = srv.party, st.config.fingerprint, st.config.kem
    private = srv.keys.private(kem)
    for i, raw in enumerate(raws):
        try:
            report = Report.from_bytes(raw)
            opened.append((i, report.report_id, open_share(report, party, private, fp, kem)))
        except ReportError as exc:
            rejected.append(Rejected(index=i, error=str(exc)))
    size, extras = st.dcf.key_size, st.config.extras_bytes // 8
    keys = []
    for i, rid, share in opened:
        try:
            keys.append((i, rid, share, split_share(share, size, extras)[0]))
        except ReportError as exc:
            rejected.append(Rejected(index=i, error=str(exc)))
    try:
        st.dcf.batch_from_keys([k[3] for k in keys], party)
        valid = {k[0] for k in keys}
    except FssError:  # find the bad ones
        valid = set()
        for i, _, _, key in keys:
            try:
                st.dcf.key_from_bytes(key, party=party)
                valid.add(i)
            except FssError:
                pass
    good = []
    for i, rid, share, _ in keys:
        if i in valid:
            good.append((rid, share))
        else:
            rejected.append(Rejected(index=i, error="the share is not a key of this task's function for this server"))
    rejected.sort(key=lambda r: r.index)
    return good, rejected
