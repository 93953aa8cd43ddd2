"""Taking reports in: the checks, the opening and the storing of uploaded reports, for the routes of
`routers.reports` (one report, or a batch of them in `wire.encode_batch`'s framing), which only map
what this module answers to HTTP. A report is acknowledged only once its key share is committed; a
malformed, truncated, wrongly sealed, foreign or duplicate one is refused with its reason and not stored.

Only the same bytes are a duplicate (issue 42): a report whose id this server already holds is
acknowledged ("duplicate") only if the stored share is byte-identical to this one's (a spooled report
sent again after a crash); under another share, whoever learned the id first stored theirs, and this
report is answered 409 "report id taken by other content" (one upload) or listed in `rejected` and
counted in `conflicts` (a batch), never acknowledged, so its client knows it will not count. Each
server compares its own share (`Server.add_reports`); conflicts are not charged to the address (the
honest sender of a front-run report would be charged for the attacker's doing).

Refusing junk is cheap and costs its sender (`limits`): the cheap checks come first (the batch's
framing, each report's framing, its task fingerprint, the sealed shares' lengths), then a closed
collection is refused, and only then is any share opened with this server's key (a format 2
capsule once per request, `wire.Opener`: its reports' shares then cost one AES-GCM open each). Every refused
report adds one to its client address's failure level; a batch with more than REJECTS_PER_BATCH
refused reports is refused whole (400, nothing stored), and one whose address reaches the refusal
level while its shares are opened stops there (429 with Retry-After, nothing stored). An opened share
counts only if it is a key of this task's DCF for this server (`fss.layout.keys_from_rows`: one
vectorized decode of the whole batch, and per key only to name a bad one).

An unknown task id gets the answers a task gets for reports made for another task (400 for one
report, every report of a batch refused), so task ids cannot be probed."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from fss import layout

from ..wire import FOREIGN, TAG_BYTES, TAKEN, Layout, Opener, Report, ReportError, capsule_length, decode_batch, split_shares
from .errors import HttpError, ReportIdTaken, TaskNotFound
from .limits import Failures
from .metrics import Metrics
from .state import Server, TaskState, closed_because

REJECTS_PER_BATCH = 16  # refused reports a batch may hold and still be taken
RECHECK = 64  # shares opened between two readings of the address's allowance (without a refusal here)
NOT_A_KEY = "the share is not a key of this task's function for this server"


class TooManyFailures(HttpError):
    """429: the client's address reached the refusal level (`limits.Failures`)."""

    def __init__(self, wait: float):
        wait = max(1, math.ceil(wait))
        super().__init__(429, f"too many of this address's reports failed to open; send again in {wait} s",
                         {"Retry-After": str(wait)})


class Refused(NamedTuple):
    """A report not stored: its index in the upload, and why."""

    index: int  # type: ignore[assignment]  # (a field named as tuple.index, which it hides)
    error: str


@dataclass(frozen=True)
class BatchTaken:
    """What a batch came to: reports stored now, reports stored before with these very bytes
    (acknowledged, counted once), the reports not stored by index (refused, or their id taken by
    another share: `conflicts` of them), in index order."""

    accepted: int
    duplicates: int
    rejected: list[Refused]
    conflicts: int


def known_task(task_id: str, srv: Server) -> TaskState | None:
    """The task, or None for an id this server does not know (answered as a foreign task's reports)."""
    try:
        return srv.task(task_id)
    except TaskNotFound:
        return None


def take_one(srv: Server, task_id: str, raw: bytes, address: str, failures: Failures, metrics: Metrics) -> None:
    """Stores one report (`wire.Report.to_bytes`) or raises: 400 with the reason it is refused, 409 for
    a duplicate id (with these bytes: already counted; with another share: `ReportIdTaken`), and
    `accept`'s 409 and 429."""
    st = known_task(task_id, srv)
    good, rejected = accept(srv, st, [raw], address, failures)
    if rejected:
        metrics.count_reports(0, 0, [rejected[0].error])
        raise HttpError(400, rejected[0].error)
    taken: list[int] = []
    if st is None or not srv.add_reports(st, good, taken):  # (an unknown task's report is refused above)
        metrics.count_reports(0, 0 if taken else 1, [TAKEN] if taken else [])
        if taken:  # another share under this id: not this report (issue 42)
            raise ReportIdTaken()
        raise HttpError(409, "duplicate report id: already stored and counted once")
    metrics.count_reports(1, 0, [])


def take_batch(srv: Server, task_id: str, raw: bytes, address: str, failures: Failures, metrics: Metrics) -> BatchTaken:
    """Stores the good reports of a batch (`wire.encode_batch`); names each refused one by its index (at
    most REJECTS_PER_BATCH of them: a batch with more is refused whole), and each whose id this server
    holds with another share (`conflicts`, also in `rejected`: an earlier client reads them as refused).
    400 for a batch whose framing is broken (charged to the address), and `accept`'s refusals."""
    try:
        raws = decode_batch(raw)
    except ReportError as exc:
        failures.charge(address)
        raise HttpError(400, str(exc)) from None
    st = known_task(task_id, srv)
    good, rejected = accept(srv, st, raws, address, failures)
    taken: list[int] = []
    added = srv.add_reports(st, good, taken) if st is not None else 0  # and the new reports' batches, now
    refused = {r.index for r in rejected}
    at = [i for i in range(len(raws)) if i not in refused]  # good's indices in the batch (`accept` keeps its order)
    conflicts = [Refused(at[k], TAKEN) for k in taken]
    duplicates = len(good) - added - len(taken)
    metrics.count_reports(added, duplicates, [r.error for r in rejected + conflicts])
    return BatchTaken(added, duplicates, sorted(rejected + conflicts), len(taken))


class _Refusals:
    """The refused reports of one upload: each charged to the address as it is refused, and the upload
    refused whole (400) once there are more than REJECTS_PER_BATCH of them."""

    def __init__(self, address: str, failures: Failures):
        self.address, self.failures = address, failures
        self.list: list[Refused] = []

    def __call__(self, i: int, error: str) -> None:
        self.list.append(Refused(i, error))
        self.failures.charge(self.address)
        if len(self.list) > REJECTS_PER_BATCH:
            first = min(self.list)
            raise HttpError(400, f"batch refused: more than {REJECTS_PER_BATCH} of its reports are refused "
                            f"(report {first.index}: {first.error})")


def _sealed(srv: Server, st: TaskState | None, raws: list[bytes], refuse: _Refusals) -> list[tuple[int, bytes, bytes, bytes, int]]:
    """The cheap checks, for every report, before any share is opened: (index, report id, capsule,
    ciphertext, format) of each report framed for this task with shares of this task's lengths; the
    others refused. The framing of a whole format 2 batch is checked at once (`wire.Layout`)."""
    candidates = []
    if st is not None:
        fp, kem = st.config.fingerprint, st.config.kem
        plain = st.dcf.key_size + st.config.extras_bytes + TAG_BYTES
        lengths = {v: (capsule_length(kem, v), plain) for v in (1, 2)}  # (AES-GCM's and HPKE's tags are 16 bytes)
        frame = Layout(fp, *lengths[2])
    fits = frame.matches(raws) if st is not None else [False] * len(raws)
    for i, raw in enumerate(raws):
        if fits[i]:
            candidates.append((i, *frame.sealed(raw, srv.party), 2))
            continue
        try:
            report = Report.from_bytes(raw)
            if st is None or report.fingerprint != fp:
                raise ReportError(FOREIGN)
            capsule, ct = report.sealed[srv.party]
            want = lengths[report.version]
            if (len(capsule), len(ct)) != want:
                raise ReportError(f"this server's sealed share must be a {want[0]}-byte "
                                  f"{'capsule' if report.version == 2 else 'encapsulated key'} and a "
                                  f"{want[1]}-byte ciphertext for this task")
            candidates.append((i, report.report_id, capsule, ct, report.version))
        except ReportError as exc:
            refuse(i, str(exc))
    return candidates


def _open(srv: Server, st: TaskState, candidates: list, address: str, failures: Failures,
          refuse: _Refusals) -> list[tuple[int, bytes, bytes]]:
    """(index, report id, share) of each candidate whose share opens with this server's key; the others
    refused. The address's allowance is read before the first open, every RECHECK opens and after each
    refusal (other requests of this address count too): 429 once it is used up."""
    opener = Opener(srv.keys.private(st.config.kem), st.config.fingerprint, srv.party, st.config.kem)
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
    return opened


def accept(srv: Server, st: TaskState | None, raws: list[bytes], address: str, failures: Failures) -> tuple[list[tuple[bytes, bytes]], list[Refused]]:
    """Checks each report, cheap checks first, then opens its share and checks that it is a key of
    this task's DCF for this server: (good, rejected), every report in one of them, good ones (report id,
    opened share) in batch order, rejected ones in index order. Charges the address one failure per
    refused report; raises 400 past REJECTS_PER_BATCH refusals, 409 for a closed collection (or one
    restored unfinished from a backup), 429 when the address runs out of failures while shares are opened."""
    refuse = _Refusals(address, failures)
    candidates = _sealed(srv, st, raws, refuse)
    if not candidates or st is None:  # (an unknown task's reports are all refused as foreign)
        return [], sorted(refuse.list)
    if not st.collecting():  # Restored (409) first if restored unfinished from a backup
        raise HttpError(409, closed_because(srv, st.config.task_id))
    opened = _open(srv, st, candidates, address, failures, refuse)
    fine, rows, bad = split_shares([share for _, _, share in opened], st.dcf.key_size, st.config.extras_bytes // 8)
    for k, error in bad.items():
        refuse(opened[k][0], error)
    not_keys = layout.keys_from_rows(st.dcf, rows, srv.party).bad  # each a key of this task's DCF for this server
    good = []
    for row, k in enumerate(fine):
        i, rid, share = opened[k]
        if row in not_keys:
            refuse(i, NOT_A_KEY)
        else:
            good.append((rid, share))
    return good, sorted(refuse.list)
