"""POST /tasks/{id}/reports (one report) and /tasks/{id}/reports/batch (`wire.encode_batch`): binary
bodies. A report is acknowledged only once its key share is committed; a malformed, truncated,
wrongly sealed, foreign or duplicate one is refused with its reason and not stored.

Only the same bytes are a duplicate (issue 42): a report whose id this server already holds is
acknowledged ("duplicate") only if the stored share is byte-identical to this one's (a spooled report
sent again after a crash); under another share, whoever learned the id first stored theirs, and this
report is answered 409 "report id taken by other content" (one upload) or listed in `rejected` and
counted in `conflicts` (a batch), never acknowledged, so its client knows it will not count. Each
server compares its own share; conflicts are not charged to the address (the honest sender of a
front-run report would be charged for the attacker's doing).

Refusing junk is cheap and costs its sender (`limits`): the cheap checks come first (the batch's
framing, each report's framing, its task fingerprint, the sealed shares' lengths), then a closed
collection is refused, and only then is any share opened with this server's key (a format 2
capsule once per request, `wire.Opener`: its reports' shares then cost one AES-GCM open each). Every refused
report adds one to its client address's failure level; a batch with more than REJECTS_PER_BATCH
refused reports is refused whole (400, nothing stored), and one whose address reaches the refusal
level while its shares are opened stops there (429 with Retry-After, nothing stored).

An unknown task id gets the answers a task gets for reports made for another task (400 for one
report, every report of a batch refused), so task ids cannot be probed."""
from __future__ import annotations

import math

from fastapi import APIRouter, Request

import numpy as np

from fss import FssError
from fss.errors import KeyFormatError

from ...wire import FOREIGN, TAG_BYTES, TAKEN, Layout, Opener, Report, ReportError, capsule_length, decode_batch, split_shares
from ..deps import RawBody, ServerDep
from ..errors import HttpError, ReportIdTaken, TaskNotFound
from ..limits import client_address
from ..models import Accepted, BatchAccepted, Error, Rejected, errors
from ..state import Server, TaskState, closed_because

router = APIRouter(prefix="/tasks/{task_id}/reports", tags=["reports"])

REJECTS_PER_BATCH = 16  # refused reports a batch may hold and still be taken
RECHECK = 64  # shares opened between two readings of the address's allowance (without a refusal here)
RETRY_STATUS = {429: {"model": Error, "description": "this address sent too many reports that "
                      "did not open: send again after Retry-After seconds",
                      "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}}}}


class TooManyFailures(HttpError):
    """429: the client's address reached the refusal level (`limits.Failures`)."""

    def __init__(self, wait: float):
        wait = max(1, math.ceil(wait))
        super().__init__(429, f"too many of this address's reports failed to open; send again in {wait} s",
                         {"Retry-After": str(wait)})


def known_task(task_id: str, srv: Server) -> TaskState | None:
    """The task, or None for an id this server does not know (answered as a foreign task's reports)."""
    try:
        return srv.task(task_id)
    except TaskNotFound:
        return None


def _binary(what: str) -> dict:
    schema = {"type": "string", "format": "binary", "description": what}
    return {"requestBody": {"required": True, "content": {"application/octet-stream": {"schema": schema}}}}


@router.post("", status_code=201, response_model=Accepted, responses={**errors(400, 408, 409, 413), **RETRY_STATUS},
             openapi_extra=_binary("one report (`wire.Report.to_bytes`)"))
def upload(task_id: str, request: Request, srv: ServerDep, raw: RawBody) -> Accepted:
    st = known_task(task_id, srv)
    good, rejected = accept(srv, st, [raw], client_address(request.scope), request.app.state.failures)
    metrics = request.app.state.metrics
    if rejected:
        metrics.count_reports(0, 0, [rejected[0].error])
        raise HttpError(400, rejected[0].error)
    taken: list[int] = []
    if not srv.add_reports(st, good, taken):
        metrics.count_reports(0, 0 if taken else 1, [TAKEN] if taken else [])
        if taken:  # another share under this id: not this report (issue 42)
            raise ReportIdTaken()
        raise HttpError(409, "duplicate report id: already stored and counted once")
    metrics.count_reports(1, 0, [])
    return Accepted()


@router.post("/batch", response_model=BatchAccepted, responses={**errors(400, 408, 409, 413), **RETRY_STATUS},
             openapi_extra=_binary("reports in one batch (`wire.encode_batch`)"))
def upload_batch(task_id: str, request: Request, srv: ServerDep, raw: RawBody) -> BatchAccepted:
    """Stores the good reports of the batch; names each refused one by its index (at most
    REJECTS_PER_BATCH of them: a batch with more is refused whole), and each whose id this server
    holds with another share (`conflicts`, also in `rejected`: an earlier client reads them as refused)."""
    address, failures = client_address(request.scope), request.app.state.failures
    try:
        raws = decode_batch(raw)
    except ReportError as exc:
        failures.charge(address)
        raise HttpError(400, str(exc)) from None
    st = known_task(task_id, srv)
    good, rejected = accept(srv, st, raws, address, failures)
    taken: list[int] = []
    added = srv.add_reports(st, good, taken)  # and round one of a verified task's new reports, now
    refused = {r.index for r in rejected}
    at = [i for i in range(len(raws)) if i not in refused]  # good's indices in the batch (`accept` keeps its order)
    conflicts = [Rejected(index=at[k], error=TAKEN) for k in taken]
    duplicates = len(good) - added - len(taken)
    request.app.state.metrics.count_reports(added, duplicates, [r.error for r in rejected + conflicts])
    return BatchAccepted(accepted=added, duplicates=duplicates, rejected=sorted(rejected + conflicts, key=lambda r: r.index),
                         conflicts=len(taken))


def accept(srv: Server, st: TaskState | None, raws: list[bytes], address: str, failures) -> tuple[list[tuple[bytes, bytes]], list[Rejected]]:
    """Checks each report, cheap checks first, then opens its share and checks that it is a key of
    this task's DCF for this server: (good, rejected), every report in one of them, good ones (report id,
    opened share) in batch order (one vectorized decode for the whole batch; per key only to name
    a bad one). Charges the address one failure per refused report; raises 400 past
    REJECTS_PER_BATCH refusals, 409 for a closed collection (or one restored unfinished from a backup),
    429 when the address runs out of failures while shares are opened (its allowance is read again after each of this batch's
    refusals and every RECHECK opened shares, so another request's refusals count within those)."""
    party = srv.party
    rejected: list[Rejected] = []

    def refuse(i: int, error: str) -> None:
        rejected.append(Rejected(index=i, error=error))
        failures.charge(address)
        if len(rejected) > REJECTS_PER_BATCH:
            first = min(rejected, key=lambda r: r.index)
            raise HttpError(400, f"batch refused: more than {REJECTS_PER_BATCH} of its reports are refused "
                            f"(report {first.index}: {first.error})")

    candidates: list[tuple[int, bytes, bytes, bytes, int]] = []  # (index, report id, capsule, ciphertext, format)
    if st is not None:
        fp, kem = st.config.fingerprint, st.config.kem
        plain = st.dcf.key_size + st.config.extras_bytes + TAG_BYTES
        lengths = {v: (capsule_length(kem, v), plain) for v in (1, 2)}  # (AES-GCM's and HPKE's tags are 16 bytes)
        layout = Layout(fp, *lengths[2])
    fits = layout.matches(raws) if st is not None else [False] * len(raws)
    for i, raw in enumerate(raws):  # the cheap checks, for every report, before any share is opened
        if fits[i]:  # the framing of the whole batch checked at once (`wire.Layout`)
            candidates.append((i, *layout.sealed(raw, party), 2))
            continue
        try:
            report = Report.from_bytes(raw)
            if st is None or report.fingerprint != fp:
                raise ReportError(FOREIGN)
            capsule, ct = report.sealed[party]
            want = lengths[report.version]
            if (len(capsule), len(ct)) != want:
                raise ReportError(f"this server's sealed share must be a {want[0]}-byte "
                                  f"{'capsule' if report.version == 2 else 'encapsulated key'} and a "
                                  f"{want[1]}-byte ciphertext for this task")
            candidates.append((i, report.report_id, capsule, ct, report.version))
        except ReportError as exc:
            refuse(i, str(exc))
    if not candidates:
        return [], sorted(rejected, key=lambda r: r.index)
    if not st.collecting():  # Restored (409) first if restored unfinished from a backup
        raise HttpError(409, closed_because(srv, st.config.task_id))
    opener = Opener(srv.keys.private(kem), fp, party, kem)
    opened, allowance = [], 0
    for k, (i, rid, capsule, ct, version) in enumerate(candidates):
        if allowance <= 0 or k % RECHECK == 0:
            allowance = failures.allowance(address)
            if allowance <= 0:
                raise TooManyFailures(failures.refused_for(address))
        try:
            opened.append((i, rid, opener(rid, capsule, ct, version)))
        except ReportError as exc:
            refuse(i, str(exc))
            allowance = 0  # read again before the next open: other requests of this address count too
    size, extras = st.dcf.key_size, st.config.extras_bytes // 8
    fine, rows, bad = split_shares([share for _, _, share in opened], size, extras)
    for k, error in bad.items():
        refuse(opened[k][0], error)
    keys = [opened[k] for k in fine]
    header = st.dcf.params.header(party)
    heads = (rows[:, :len(header)] == np.frombuffer(header, np.uint8)).all(axis=1).tolist()
    try:  # each key of this task's DCF for this server: its header here, its body in one decode
        if not all(heads):
            raise KeyFormatError("a key's header is not this task's")
        st.dcf.batch_from_bytes(st.dcf.params.header(party, batch=True) + len(keys).to_bytes(8, "little")
                                + rows[:, len(header):].tobytes(), party)
        valid = {k[0] for k in keys}
    except FssError:  # find the bad ones
        valid = set()
        for (i, _, share), head in zip(keys, heads):
            try:
                if head:
                    st.dcf.key_from_bytes(share[:size], party=party)
                    valid.add(i)
            except FssError:
                pass
    good = []
    for i, rid, share in keys:
        if i in valid:
            good.append((rid, share))
        else:
            refuse(i, "the share is not a key of this task's function for this server")
    rejected.sort(key=lambda r: r.index)
    return good, rejected
