"""The client side of the service: register a task with both servers (the operator), turn private
values into reports and upload them (each person).

A report is a value's grid index alpha and a DCF key pair for [t >= alpha] (with a payload vector for
label and calibration tasks), each key sealed to its server (`wire`, format 2: the reports of one
`make_reports` call share one HPKE capsule per server, each share AES-GCM under its key).
pyca/cryptography does the HPKE and AES-GCM (OpenSSL underneath).
"""
from __future__ import annotations

import os
import secrets
import sys
import threading
from typing import Sequence, cast
from pathlib import Path

import numpy as np

from fss import layout

from ...errors import DomainError, DpcdfError, ParameterError
from ...release.adaptive import PLAN_VERSION
from ...release.payload import Payload
from .. import hpke
from ..http import ServerError, http
from ..task import TaskConfig, check_distinct_servers, token_hash
from ..wire import ID_BYTES, MAX_BATCH, NONCE_BYTES, TAKEN, Report, Sealer, encode_batch
from .spool import Spool, SpoolStatus, ranges, shown


def make_reports(config: TaskConfig, values, labels=None) -> list[Report]:
    """One report per value: the value's grid index alpha, the DCF key pair for [t >= alpha] (with
    payload (label, 1 - label) for a label task), each key sealed to its server, followed for a
    verified task by the client's shares of its check randomness. Randomness: the DCF's CSPRNG
    seeds, the check's (`secrets`), a random 16-byte report id, the capsules' keys (os.urandom).
    The reports share one capsule per server and MAX_BATCH reports (`wire`, format 2): they are
    linkable as made together; make one report per call where that matters."""
    check_distinct_servers(config.servers, config.hpke_keys)  # before anything is sealed (SameServerError)
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        raise ParameterError("no values to report")
    alphas = config.make_grid().index(v)
    betas = config.payload.betas(v, labels)  # 1, (label, 1 - label) or (1, label, q)
    dcf = config.key_dcf()
    extras = (None, None)
    if config.verify:  # keys with the check's MAC payload, then the client's check randomness (`wire.split_share`)
        units = np.broadcast_to(np.asarray(betas, np.int64).reshape(-1, config.width), (v.size, config.width))
        betas, *extras = config.check().client_report(units)
    k0, k1 = dcf.gen_batch(alphas, betas)
    rows = [share_rows(dcf, k, e) for k, e in zip((k0, k1), extras)]
    width, flat0, flat1 = rows[0].shape[1], rows[0].tobytes(), rows[1].tobytes()
    fp = config.fingerprint
    pks = [hpke.public_key(config.kem, h) for h in config.hpke_keys]
    ids = report_ids(v.size)
    reports = []
    for i in range(v.size):  # one pass: two AES-GCM seals per report, nothing else per key
        if i % MAX_BATCH == 0:
            s0, s1 = (Sealer(pk, fp, party, config.kem) for party, pk in enumerate(pks))
        rid, at = ids[i * ID_BYTES : (i + 1) * ID_BYTES], slice(i * width, (i + 1) * width)
        reports.append(Report(fp, rid, ((s0.capsule, s0.seal(rid, flat0[at])), (s1.capsule, s1.seal(rid, flat1[at])))))
    return reports


def report_ids(n: int) -> bytes:
    """n random report ids (`secrets`), ID_BYTES each, whose first NONCE_BYTES are all distinct (each
    is its share's AES-GCM nonce under the capsule's key: drawn again in the rare case, 2^-64 at n =
    2^16, that two collide)."""
    while True:
        ids = secrets.token_bytes(ID_BYTES * n)
        if len({ids[i : i + NONCE_BYTES] for i in range(0, len(ids), ID_BYTES)}) == n:
            return ids


def share_rows(dcf, batch, extras: np.ndarray | None = None) -> np.ndarray:
    """Each key of `batch` in the single-key wire format (`Key.to_bytes()`), then (verified tasks) its
    row of `extras` as 8-byte little-endian field elements (`wire.join_share`): one (n, width) uint8
    row per key, from one pass over the batch (`fss.layout.key_rows`)."""
    n, size = batch.n, dcf.key_size
    x = 0 if extras is None else np.asarray(extras).shape[1]
    rows = np.empty((n, size + 8 * x), np.uint8)
    layout.key_rows(batch, out=rows[:, :size])
    if x:
        rows[:, size:] = np.ascontiguousarray(extras, dtype="<u8").view(np.uint8).reshape(n, 8 * x)
    return rows


def key_bytes(dcf, batch) -> list[bytes]:
    """Each key of `batch` in the single-key wire format (`Key.to_bytes()`), from one serialization."""
    flat, size = share_rows(dcf, batch).tobytes(), dcf.key_size
    return [flat[i * size : (i + 1) * size] for i in range(batch.n)]


def create_task(servers: list[str], grid: dict, epsilon: float | None, mechanism: str, relation: str, min_batch: int,
                kem: str = "x25519", payload: str = "count", split: float = 0.5,
                admin_tokens: str | Sequence[str] | None = None, verify: bool | None = None,
                rho: float | None = None, adaptive_plan: int | None = None, name: str | None = None) -> tuple[TaskConfig, str]:
    """The operator's step: fetches both servers' HPKE keys, registers the task with both (each needs
    its operator token: one for both, a pair, or $DPCDF_ADMIN_TOKEN), returns it and the analyst token.
    verify: check every report at the close (`TaskConfig.verify`; None: where the task allows it).
    rho (with epsilon None): a rho-zCDP task (mechanism 'factorization' or 'tree', discrete Gaussian).
    adaptive_plan: an adaptive task's plan version (`TaskConfig.adaptive_plan`; None: the newest).
    name: a label for people (`TaskConfig.name`; public: every client and both operators see it).

    Whoever writes a task config chooses the servers' keys in it: clients must check that the keys
    are those of the two organisations they trust (an analyst who names a server it runs would get
    both shares)."""
    admin = admin_tokens if admin_tokens is not None else os.environ.get("DPCDF_ADMIN_TOKEN") or None
    if admin is None:
        raise ParameterError("registering a task needs each server's operator token (--admin-token-file, or "
                             "DPCDF_ADMIN_TOKEN in the environment)")
    admin = (admin, admin) if isinstance(admin, str) else tuple(admin)
    if len(servers) != 2:
        raise ParameterError(f"a task has exactly two servers, got {len(servers)}")
    check_distinct_servers(servers)  # the URLs, before any request
    keys = [http("GET", f"{url}/hpke")["keys"][kem] for url in servers]
    check_distinct_servers(servers, keys)  # two URLs of one server answer with one key
    token = secrets.token_urlsafe(24)
    privacy = "pure" if rho is None else "zcdp"
    config = TaskConfig(grid, None if epsilon is None else float(epsilon), mechanism, relation, int(min_batch),
                        (servers[0], servers[1]), (keys[0], keys[1]), token_hash(token),
                        payload=cast(Payload, payload),  # (its name: TaskConfig parses it)
                        split=split, kem=kem, verify=verify, privacy=privacy, rho=rho, name=name,
                        adaptive_plan=PLAN_VERSION if adaptive_plan is None else adaptive_plan)
    http("POST", f"{servers[0]}/tasks", config.to_json().encode(), admin[0])
    try:
        http("POST", f"{servers[1]}/tasks", config.to_json().encode(), admin[1])
    except ServerError as exc:  # not left registered on server 0 alone (review of issue 24)
        try:
            http("DELETE", f"{servers[0]}/admin/tasks/{config.task_id}", token=admin[0])
        except ServerError as undo:
            raise ServerError(f"{exc}; deleting it again on server 0 failed ({undo}): run `dpcdf admin delete "
                              f"{config.task_id}` there", exc.status) from None
        raise ServerError(f"{exc} (the task was deleted again on server 0)", exc.status) from None
    return config, token


class UploadIncomplete(DpcdfError):
    """Some reports were not acknowledged by both servers (a server unreachable or failing for the whole
    retry window). They stay in the spool: running the same upload again sends exactly those.
    `status`: the spool's counts; `summary`: what `submit` would have returned."""

    def __init__(self, message: str, status: SpoolStatus, summary: dict | None = None):
        super().__init__(message)
        self.status, self.summary = status, summary or {}


OUTSIDE = ("clamp", "refuse")


def outside_grid(config: TaskConfig, values: np.ndarray, lines=None) -> dict:
    """Values outside the grid's range [t_0, t_last]: how many below and above, and the first lines
    (1-based rows, or `lines`) of each. A value below t_0 counts at t_0 and one above t_last at t_last."""
    t = config.make_grid().thresholds
    below, above = np.flatnonzero(values < t[0]), np.flatnonzero(values > t[-1])
    at = (lambda idx: [int(lines[i]) for i in idx[:5]]) if lines is not None else (lambda idx: [int(i) + 1 for i in idx[:5]])
    return {"below": int(below.size), "above": int(above.size), "first": float(t[0]), "last": float(t[-1]),
            "below_at": at(below), "above_at": at(above)}


def submit(config: TaskConfig, values, batch: int = 1000, progress: bool = False, labels=None,
           spool: str | Path | None = None, retry_for: float = 30.0, *, source: str = "python",
           contents=None, lines=None, allow_duplicates: bool = False, outside: str = "clamp") -> dict:
    """Makes the reports for `values` (and `labels`, for label and calibration tasks) into the spool,
    `batch` at a time, and uploads each server's share of every report in the spool until both servers
    acknowledged it: both servers at once, each on its own thread, while the next batch is made (a
    report is sent only once its batch is committed to the spool).

    Resumable and idempotent: with a spool file, a re-run (after any crash of a server, the network or
    this process) makes no new report for a spooled row and sends each server only what it has not
    acknowledged; a report a server already stored comes back as a duplicate, which acknowledges it (the
    same bytes only: a server holding another share under its id answers a conflict, below).
    The spool knows rows by content (`dpcdf.service.client.spool`): the same input again sends nothing new, an
    input from `source` that extends what was spooled from it makes only the new rows, and rows equal
    to rows spooled from another source raise `DuplicateRows` unless `allow_duplicates` (`contents`:
    each row's bytes, e.g. its CSV fields, so that two people with equal values and different rows differ;
    `lines`: each row's line number, for messages).
    Values outside the grid's range are counted (`outside` in the result); `outside="clamp"` counts each
    at the nearest end of the grid, as the release defines it, "refuse" raises DomainError first.
    Connection errors, timeouts, 5xx and 429 are retried with exponential backoff for `retry_for`
    seconds per server; past that, `UploadIncomplete` (the rest stays pending in the spool). A refusal
    of the whole batch (e.g. 409: the collection is closed) raises `ServerError` at once. Without a
    spool path the spool is in memory: nothing survives this process.
    Returns counts: rows (of this input), new (reports made now), already_spooled (rows of this input
    spooled before), duplicates_allowed; over the whole spool: reports, complete (both servers),
    pending, rejected, conflicts; outside; the spool's path; notes (sentences for the user).
    `conflicts` (also in `rejected`): reports whose id a server holds with other content (issue 42:
    someone who learned the id first sent their own report under it); such a report is not stored
    there, will not count, and is never taken as acknowledged (`dpcdf submit` exits non-zero)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    labels = None if labels is None else np.asarray(labels).reshape(-1)
    if not 1 <= batch <= MAX_BATCH:
        raise ParameterError(f"batch must be in [1, {MAX_BATCH}], got {batch}")
    if outside not in OUTSIDE:
        raise ParameterError(f"outside must be one of {OUTSIDE}, got {outside!r}")
    if values.size == 0:
        raise ParameterError("no values to report")
    if not np.isfinite(values).all():
        raise ParameterError(f"value {values[~np.isfinite(values)][0]} is not a finite number")
    if labels is not None and labels.size != values.size:
        raise ParameterError(f"{labels.size} labels for {values.size} values")
    if contents is not None and len(contents) != values.size:
        raise ParameterError(f"{len(contents)} row contents for {values.size} values")
    lines = list(range(1, values.size + 1)) if lines is None else [int(x) for x in lines]
    out = outside_grid(config, values, lines)
    notes = []
    if out["below"] or out["above"]:
        said = "; ".join(f"{k} {side} the grid's {end} threshold {out[end]:g} (line{'s' if k > 1 else ''} "
                         f"{ranges(out[side + '_at'])}{', ...' if k > 5 else ''})"
                         for side, end, k in (("below", "first", out["below"]), ("above", "last", out["above"])) if k)
        if outside == "refuse":
            k = out['below'] + out['above']
            raise DomainError(f"{k} value{'s lie' if k > 1 else ' lies'} outside the grid: {said}; nothing was sent "
                              "(--outside clamp counts each at the nearest end of the grid)")
        notes.append(f"{out['below'] + out['above']} values outside the grid counted at its nearest end: {said} "
                     "(--outside clamp, the default; --outside refuse stops instead)")
    store = Spool.open(":memory:" if spool is None else spool, config.fingerprint)
    try:
        digests = store.digests(values, labels, contents)
        keys = store.content_digests(contents)
        admission = store.admit(digests, source, lines, allow_duplicates, keys)
        new = admission.new
        if admission.spooled:
            notes.append(f"{admission.spooled} of the {values.size} rows were spooled before from this input: "
                         "not made again" + (" (a re-run sends only what a server has not acknowledged)"))
        if admission.duplicates:
            notes.append(f"{len(admission.duplicates)} rows equal rows sent from another input, sent again as "
                         "--allow-duplicates asked")
        if admission.new_version and source != "--values":
            notes.append(f"{shown(source)} changed since it was spooled (rows spooled from it are missing): its rows are "
                         "treated as a new input")
        with _Uploads(config, store, batch, progress, retry_for, new.size) as uploads:  # both servers at once, as rows are made
            for start in range(0, new.size, batch):
                idx = new[start : start + batch]
                made = make_reports(config, values[idx], None if labels is None else labels[idx])
                store.add(admission, [(r.report_id, r.to_bytes(), digests[i], lines[i], keys and keys[i]) for r, i in zip(made, idx)])
                uploads.more(len(made))  # committed first: a report is sent only once it is in the spool
            uploads.finish()
        status = store.status()
        refusals = store.rejections()
    finally:
        store.close()
    taken = len({row for row, _, why in refusals if why.startswith(TAKEN)})  # a conflict at either server
    if taken:
        at = " and ".join(f"server {p}" for p in sorted({party for _, party, why in refusals if why.startswith(TAKEN)}))
        notes.append(f"{taken} reports conflicted ({TAKEN} at {at}): someone who learned their report ids sent reports "
                     "of their own under them first; these are not acknowledged and will not count")
    summary = {"rows": int(values.size), "new": int(new.size), "already_spooled": admission.spooled,
               "duplicates_allowed": len(admission.duplicates), "reports": status.rows, "complete": status.complete,
               "pending": status.pending, "rejected": status.rejected, "conflicts": taken,
               "outside": {"below": out["below"], "above": out["above"], "handled": outside},
               "spool": None if spool is None else str(spool), "notes": notes}
    if refusals:  # why the first refused report was refused (by which server)
        summary["first_refusal"] = f"server {refusals[0][1]}: {refusals[0][2]}"
    if status.pending:
        why = "".join(f" (server {party} did not answer for {retry_for:g} s: {error})" for party, error in sorted(uploads.failing.items()))
        raise UploadIncomplete(f"{status.pending} of {status.rows} reports are not yet acknowledged by both servers{why}; "
                               + (f"run the same command again to send them (spool {spool})" if spool else
                                  "call submit again with a spool file to make uploads resumable"), status,
                               {k: v for k, v in summary.items() if k != "notes"})
    return summary


class _Uploads:
    """Sends each server its unacknowledged reports from the spool, a batch at a time, one thread per
    server, while the caller goes on making reports into the spool (`more` after each commit, `finish`
    after the last). Every answer is recorded in the spool before that server's next request. A server
    failing for `retry_for` seconds (connections, 5xx, 429, with exponential backoff) is left with its
    reports pending; a refusal of a whole batch (e.g. 409, the collection is closed) stops both and is
    raised by `more`/`finish`. Leaving the `with` (also by Ctrl-C or an error) stops both threads before the
    spool closes: a request under way is abandoned and its answer not recorded (a re-run sends those
    reports again, and the server answers "duplicate", which acknowledges them)."""

    def __init__(self, config: TaskConfig, store: Spool, batch: int, progress: bool, retry_for: float, coming: int = 0):
        self.config, self.store, self.batch, self.progress, self.retry_for = config, store, batch, progress, retry_for
        self.changed = threading.Condition()  # guards the fields below; never held while the spool is used
        self.made, self.made_all, self.stopped = 0, False, False
        self.error: BaseException | None = None
        self.acked = {party: store.acknowledged(party) for party in (0, 1)}
        self.total, self.shown = store.spooled() + coming, -1  # with the `coming` reports still to be made
        self.failing: dict[int, str] = {}  # party -> its last error, while its requests fail
        self.printing = threading.Lock()  # the progress line and the notes of both threads
        self.threads = [threading.Thread(target=self._run, args=(party,), name=f"dpcdf-upload-{party}", daemon=True)
                        for party in (0, 1)]

    def __enter__(self) -> "_Uploads":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.changed:
            self.stopped = True
            self.changed.notify_all()
        with self.store.mutex:  # a thread inside the spool has left it; none enters again (each checks `stopped`)
            pass
        if self.shown >= 0:
            print(file=sys.stderr)

    def more(self, count: int) -> None:
        """`count` new reports are committed to the spool (counted in the total from the start)."""
        with self.changed:
            self.made += 1
            self.changed.notify_all()
            self._raise()
        self._show()

    def finish(self) -> None:
        """Every report is made: waits until both threads have sent what they can."""
        with self.changed:
            self.made_all = True
            self.changed.notify_all()
        while True:
            with self.changed:
                self._raise()
                if not any(t.is_alive() for t in self.threads):
                    break
                self.changed.wait(0.5)
            self._show()
        self._show()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _show(self) -> None:
        with self.changed:
            done, total = min(self.acked.values()), self.total
        if self.progress and done != self.shown:
            with self.printing:
                self.shown = done
                bar = "#" * (30 * done // max(total, 1))
                print(f"\r[{bar:<30}] {done}/{total} reports on both servers", end="", file=sys.stderr, flush=True)

    def _note(self, party: int, error: ServerError, first: bool) -> None:
        """Server `party`'s request failed and is retried: said once per outage (on the command line)."""
        with self.changed:
            self.failing[party] = str(error)
        if self.progress and first:
            with self.printing:
                print(("\n" if self.shown >= 0 else "") + f"note: server {party}: {error}; retrying for "
                      f"{self.retry_for:g} s (--retry-for)", file=sys.stderr, flush=True)
                self.shown = -1

    def _run(self, party: int) -> None:
        try:
            self._send(party)
        except BaseException as exc:  # a refusal of a whole batch, or a bug: the caller raises it
            with self.changed:
                if self.error is None and not self.stopped:
                    self.error = exc
        finally:
            with self.changed:
                self.changed.notify_all()

    def _over(self) -> bool:
        return self.stopped or self.error is not None

    def _send(self, party: int) -> None:
        url = f"{self.config.servers[party]}/tasks/{self.config.task_id}/reports/batch"
        store, after, waited, tries = self.store, -1, 0.0, 0
        while True:
            with self.changed:
                if self._over():
                    return
                made, made_all = self.made, self.made_all
            with store.mutex:
                if self.stopped:
                    return
                rows = store.unacknowledged(party, self.batch, after)
            if not rows:
                if made_all:
                    return  # every report sent: acknowledged, or refused for good
                with self.changed:  # until more reports are made (or all are)
                    self.changed.wait_for(lambda: self.made != made or self.made_all or self._over())
                continue
            try:
                res = http("POST", url, encode_batch([b for _, b in rows]), content_type="application/octet-stream",
                           timeout=60)
            except ServerError as exc:
                if not exc.retryable:
                    raise
                self._note(party, exc, tries == 0)
                pause = min(5.0, 0.2 * 2 ** tries)
                if waited + pause > self.retry_for:
                    return  # give up on this server for now; its reports stay pending
                with self.changed:
                    if self.changed.wait_for(self._over, pause):
                        return
                waited, tries = waited + pause, tries + 1
                continue
            waited, tries = 0.0, 0
            with self.changed:
                self.failing.pop(party, None)
            refused = {rows[r["index"]][0]: str(r["error"]) for r in res["rejected"]}
            with store.mutex:
                if self.stopped:
                    return
                store.record(party, [row for row, _ in rows if row not in refused], refused)
            after = rows[-1][0]
            with self.changed:
                self.acked[party] += len(rows) - len(refused)
                self.changed.notify_all()
