"""The client side of the service: register a task with both servers (the operator), turn private
values into reports and upload them (each person).

A report is a value's grid index alpha and a DCF key pair for [t >= alpha] (with a payload vector for
label and calibration tasks), each key sealed to its server (`wire`). pyca/cryptography does the HPKE
(OpenSSL underneath: about 40 us to open a share here, seven times faster than pycryptodome's, which the
tests use to cross-check interoperability).
"""
from __future__ import annotations

import secrets
import sys

import numpy as np

from . import hpke
from ..errors import ParameterError
from ..release.calibration import fixed_point
from .http import http
from .task import TaskConfig, token_hash
from .wire import ID_BYTES, Report, encode_batch, hpke_info


def make_reports(config: TaskConfig, values, labels=None) -> list[Report]:
    """One report per value: the value's grid index alpha, the DCF key pair for [t >= alpha] (with
    payload (label, 1 - label) for a label task), each key sealed to its server. Randomness: the
    DCF's CSPRNG seeds, a random 16-byte report id."""
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
    fp = config.fingerprint
    keys = [hpke.public_key(config.kem, h) for h in config.hpke_keys]
    suite, enc_len = hpke.suite(config.kem), hpke.enc_length(config.kem)
    reports = []
    for i in range(v.size):
        rid = secrets.token_bytes(ID_BYTES)
        sealed = []
        for party, batch in ((0, k0), (1, k1)):
            out = suite.encrypt(batch[i].to_bytes(), keys[party], info=hpke_info(fp, rid, party))
            sealed.append((out[:enc_len], out[enc_len:]))
        reports.append(Report(fp, rid, (sealed[0], sealed[1])))
    return reports


def create_task(servers: list[str], grid: dict, epsilon: float, mechanism: str, relation: str, min_batch: int,
                kem: str = "x25519", payload: str = "count", split: float = 0.5) -> tuple[TaskConfig, str]:
    """Fetches both servers' HPKE keys, registers the task with both, returns it and the analyst token."""
    keys = [http("GET", f"{url}/hpke")["keys"][kem] for url in servers]
    token = secrets.token_urlsafe(24)
    config = TaskConfig(grid, float(epsilon), mechanism, relation, int(min_batch), (servers[0], servers[1]),
                        (keys[0], keys[1]), token_hash(token), payload=payload, split=split, kem=kem)
    for url in servers:
        http("POST", f"{url}/tasks", config.to_json().encode())
    return config, token


def submit(config: TaskConfig, values, batch: int = 500, progress: bool = False, labels=None) -> dict:
    """Makes and uploads the reports for `values` (and `labels`, for a label task) to both servers
    (each opens only its share)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    labels = None if labels is None else np.asarray(labels).reshape(-1)
    totals = {"accepted": 0, "duplicates": 0, "rejected": 0}
    for start in range(0, values.size, batch):
        part = None if labels is None else labels[start : start + batch]
        reports = [r.to_bytes() for r in make_reports(config, values[start : start + batch], part)]
        body = encode_batch(reports)
        for url in config.servers:
            res = http("POST", f"{url}/tasks/{config.task_id}/reports/batch", body, content_type="application/octet-stream")
            if url == config.servers[0]:
                totals["accepted"] += res["accepted"]
                totals["duplicates"] += res["duplicates"]
                totals["rejected"] += len(res["rejected"])
        if progress:
            done = min(values.size, start + batch)
            bar = "#" * (30 * done // values.size)
            print(f"\r[{bar:<30}] {done}/{values.size} reports", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return totals
