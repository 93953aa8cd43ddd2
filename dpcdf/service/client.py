"""The client side of the service: register a task with both servers (the operator), turn private
values into reports and upload them (each person).

A report is a value's grid index alpha and a DCF key pair for [t >= alpha] (with a payload vector for
label and calibration tasks), each key sealed to its server (`wire`). pyca/cryptography does the HPKE
(OpenSSL underneath: about 40 us to open a share here, seven times faster than pycryptodome's, which the
tests use to cross-check interoperability).
"""
from __future__ import annotations

import os
import secrets
import sys
from typing import Sequence
import time
from pathlib import Path

import numpy as np

from . import hpke
from ..errors import DpcdfError, ParameterError
from ..release.calibration import fixed_point
from .http import ServerError, http
from .spool import Spool, SpoolStatus
from .task import TaskConfig, token_hash
from .wire import ID_BYTES, MAX_BATCH, Report, encode_batch, hpke_info, join_share


def make_reports(config: TaskConfig, values, labels=None) -> list[Report]:
    """One report per value: the value's grid index alpha, the DCF key pair for [t >= alpha] (with
    payload (label, 1 - label) for a label task), each key sealed to its server, followed for a
    verified task by the client's shares of its check randomness. Randomness: the DCF's CSPRNG
    seeds, the check's (`secrets`), a random 16-byte report id."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        raise ParameterError("no values to report")
    alphas = config.make_grid().index(v)
    if config.payload in ("label", "calibration"):
        y = np.asarray(labels).reshape(-1) if labels is not None else None
        if y is None or y.size != v.size or not np.isin(y, [0, 1]).all():
            raise ParameterError(f"a {config.payload} task needs one label (0 or 1) per value")
        if config.payload == "label":
            betas = np.stack([y, 1 - y], axis=1).astype(np.int64)
        else:
            if (v < 0).any() or (v > 1).any():
                raise ParameterError("a calibration task's values are probabilities in [0, 1]")
            betas = np.stack([np.ones_like(y), y, fixed_point(v).astype(np.int64)], axis=1).astype(np.int64)
    else:
        if labels is not None:
            raise ParameterError("labels belong to label tasks")
        betas = 1
    k0, k1 = config.dcf().gen_batch(alphas, betas)
    extras = (None, None)
    if config.verify:  # the client's shares of its check randomness, after each key (`wire.split_share`)
        rows = np.broadcast_to(np.asarray(betas, np.int64).reshape(-1, config.width), (v.size, config.width))
        extras = config.check().client_extras(rows)
    fp = config.fingerprint
    keys = [hpke.public_key(config.kem, h) for h in config.hpke_keys]
    suite, enc_len = hpke.suite(config.kem), hpke.enc_length(config.kem)
    reports = []
    for i in range(v.size):
        rid = secrets.token_bytes(ID_BYTES)
        sealed = []
        for party, batch in ((0, k0), (1, k1)):
            share = batch[i].to_bytes() if extras[party] is None else join_share(batch[i].to_bytes(), extras[party][i])
            out = suite.encrypt(share, keys[party], info=hpke_info(fp, rid, party))
            sealed.append((out[:enc_len], out[enc_len:]))
        reports.append(Report(fp, rid, (sealed[0], sealed[1])))
    return reports


def create_task(servers: list[str], grid: dict, epsilon: float | None, mechanism: str, relation: str, min_batch: int,
                kem: str = "x25519", payload: str = "count", split: float = 0.5,
                admin_tokens: str | Sequence[str] | None = None, verify: bool | None = None,
                rho: float | None = None) -> tuple[TaskConfig, str]:
    """The operator's step: fetches both servers' HPKE keys, registers the task with both (each needs
    its operator token: one for both, a pair, or $DPCDF_ADMIN_TOKEN), returns it and the analyst token.
    verify: check every report at the close (`TaskConfig.verify`; None: where the task allows it).
    rho (with epsilon None): a rho-zCDP task (mechanism 'factorization' or 'tree', discrete Gaussian).

    Whoever writes a task config chooses the servers' keys in it: clients must check that the keys
    are those of the two organisations they trust (an analyst who names a server it runs would get
    both shares)."""
    admin = admin_tokens if admin_tokens is not None else os.environ.get("DPCDF_ADMIN_TOKEN") or None
    if admin is None:
        raise ParameterError("registering a task needs each server's operator token (--admin-token-file, or "
                             "DPCDF_ADMIN_TOKEN in the environment)")
    admin = (admin, admin) if isinstance(admin, str) else tuple(admin)
    keys = [http("GET", f"{url}/hpke")["keys"][kem] for url in servers]
    token = secrets.token_urlsafe(24)
    privacy = "pure" if rho is None else "zcdp"
    config = TaskConfig(grid, None if epsilon is None else float(epsilon), mechanism, relation, int(min_batch),
                        (servers[0], servers[1]), (keys[0], keys[1]), token_hash(token), payload=payload, split=split,
                        kem=kem, verify=verify, privacy=privacy, rho=rho)
    for url, operator in zip(servers, admin):
        http("POST", f"{url}/tasks", config.to_json().encode(), operator)
    return config, token


class UploadIncomplete(DpcdfError):
    """Some reports were not acknowledged by both servers (a server unreachable or failing for the whole
    retry window). They stay in the spool: running the same upload again sends exactly those."""

    def __init__(self, message: str, status: SpoolStatus):
        super().__init__(message)
        self.status = status


def submit(config: TaskConfig, values, batch: int = 500, progress: bool = False, labels=None,
           spool: str | Path | None = None, retry_for: float = 30.0) -> dict:
    """Makes the reports for `values` (and `labels`, for label and calibration tasks) into the spool,
    then uploads each server's share of them until both servers acknowledged every report.

    Resumable and idempotent: with a spool file, a re-run (after any crash of a server, the network or
    this process) makes no new report for a spooled row and sends each server only what it has not
    acknowledged; a report a server already stored comes back as a duplicate, which acknowledges it.
    Connection errors, timeouts, 5xx and 429 are retried with exponential backoff for `retry_for`
    seconds per server; past that, `UploadIncomplete` (the rest stays pending in the spool). A refusal
    of the whole batch (e.g. 409: the collection is closed) raises `ServerError` at once. Without a
    spool path the spool is in memory: nothing survives this process.
    Returns counts: reports, complete (both servers), pending, rejected, and the spool's path."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    labels = None if labels is None else np.asarray(labels).reshape(-1)
    if not 1 <= batch <= MAX_BATCH:
        raise ParameterError(f"batch must be in [1, {MAX_BATCH}], got {batch}")
    store = Spool.open(":memory:" if spool is None else spool, config.fingerprint, values, labels)
    try:
        for start in range(store.spooled(), values.size, batch):  # make every report before sending any
            part = None if labels is None else labels[start : start + batch]
            made = make_reports(config, values[start : start + batch], part)
            store.add(start, [(r.report_id, r.to_bytes()) for r in made])
        _upload(config, store, batch, progress, retry_for)
        status = store.status()
    finally:
        store.close()
    summary = {"reports": status.rows, "complete": status.complete, "pending": status.pending,
               "rejected": status.rejected, "spool": None if spool is None else str(spool)}
    if status.pending:
        raise UploadIncomplete(f"{status.pending} of {status.rows} reports are not yet acknowledged by both servers; "
                               + (f"run the same command again to send them (spool {spool})" if spool else
                                  "call submit again with a spool file to make uploads resumable"), status)
    return summary


def _upload(config: TaskConfig, store: Spool, batch: int, progress: bool, retry_for: float) -> None:
    """Sends each server its unacknowledged reports, a batch at a time, taking turns; records every
    answer in the spool before the next request."""
    active = {0, 1}
    waited, tries, after = {0: 0.0, 1: 0.0}, {0: 0, 1: 0}, {0: -1, 1: -1}
    acked = {party: store.acknowledged(party) for party in (0, 1)}
    while active:
        for party in sorted(active):
            rows = store.unacknowledged(party, batch, after[party])
            if not rows:
                active.discard(party)
                continue
            url = f"{config.servers[party]}/tasks/{config.task_id}/reports/batch"
            try:
                res = http("POST", url, encode_batch([b for _, b in rows]), content_type="application/octet-stream",
                           timeout=60)
            except ServerError as exc:
                if not exc.retryable:
                    raise
                pause = min(5.0, 0.2 * 2 ** tries[party])
                if waited[party] + pause > retry_for:
                    active.discard(party)  # give up on this server for now; its reports stay pending
                    continue
                time.sleep(pause)
                waited[party] += pause
                tries[party] += 1
                continue
            waited[party], tries[party] = 0.0, 0
            refused = {rows[r["index"]][0]: str(r["error"]) for r in res["rejected"]}
            store.record(party, [row for row, _ in rows if row not in refused], refused)
            after[party], acked[party] = rows[-1][0], acked[party] + len(rows) - len(refused)
        if progress:
            done = min(acked.values())
            bar = "#" * (30 * done // max(store.rows, 1))
            print(f"\r[{bar:<30}] {done}/{store.rows} reports on both servers", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
