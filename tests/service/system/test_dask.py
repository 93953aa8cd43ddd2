"""Evaluation on Dask: the same shares, bit for bit, as in-process; the noise added on the server."""
import pickle
import socket
import subprocess
import sys
import time
import sqlite3
from dataclasses import dataclass

import numpy as np
import psutil
import pytest

from dpcdf.analyst import Analyst
from dpcdf.release.calibration import group_scales
from dpcdf.release.ecdf import prefix_counts
from dpcdf.release.mechanisms import PathMechanism, TreeMechanism
from dpcdf.service.protocols.check import round_one
from dpcdf.service.protocols.context import StepContext
from dpcdf.service.storage import segments
from dpcdf.service.storage.store import Store
from dpcdf.service.task import TaskConfig
from dpcdf.service.wire import join_share
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.client import create_task, submit
from dpcdf.service.server import dask_check
from dpcdf.service.server.dask_eval import DaskError, DaskEvaluator, check_address
from dpcdf.service.processes import free_port, start_server, stop
from fss import DCF
from dpcdf.service.http import ServerError, http
from helpers import GRID, OPERATOR, TESTING, dpcdf_cli, values


@pytest.fixture(scope="module")
def evaluator():
    ev = DaskEvaluator("local:2")
    yield ev
    ev.close()


def _shards(tmp_path, dcf, n, betas, seed):
    alphas = np.random.default_rng(seed).integers(0, 1 << dcf.bits, n)
    k0, _ = dcf.gen_batch(alphas, betas)
    cuts = [0, n // 3, n // 3 + 17, n]  # uneven shards, one of 17 keys
    files = segments.write(tmp_path, [k0.select(slice(a, b)) for a, b in zip(cuts, cuts[1:])], "set")
    return segments.load(tmp_path, files, dcf, 0)


@pytest.mark.parametrize("mechanism", ["path", "tree"])
def test_dask_shares_are_bit_identical_to_in_process_with_the_same_noise(tmp_path, evaluator, mechanism):
    dcf = DCF(bits=9, out_bits=64, cmp="ge")
    shards = _shards(tmp_path, dcf, 20_000, 1, 1)
    mech = (PathMechanism if mechanism == "path" else TreeMechanism)(512, 1.0, "substitution")
    local = Aggregator(dcf, mech, b"s" * 32, "task", noise=True)
    remote = Aggregator(dcf, mech, b"s" * 32, "task", noise=True, evaluator=evaluator)
    grid = np.arange(512)
    full = remote.prefix_shares(shards, grid)
    np.testing.assert_array_equal(full, local.prefix_shares(shards, grid))
    np.testing.assert_array_equal(remote.prefix_shares(shards, [300]), local.prefix_shares(shards, [300]))
    assert not np.array_equal(full, remote.sums(shards, grid))  # noise was added (on this side)
    for level in mech.released_levels():
        np.testing.assert_array_equal(remote.node_shares(shards, level), local.node_shares(shards, level))
    # the same as the scatter transport and as one in-memory batch
    evaluator.transport = "scatter"
    try:
        np.testing.assert_array_equal(remote.sums(shards, grid), local.sums(shards, grid))
    finally:
        evaluator.transport = "path"
        evaluator.forget()


def test_dask_group_sums_of_a_wide_payload_are_bit_identical(tmp_path, evaluator):
    dcf = DCF(bits=8, out_bits=64, width=3, cmp="ge")
    rng = np.random.default_rng(2)
    betas = np.stack([np.ones(5000, np.int64), rng.integers(0, 2, 5000), rng.integers(0, 1 << 16, 5000)], axis=1)
    shards = _shards(tmp_path, dcf, 5000, betas, 3)
    mech = TreeMechanism(256, 0.5, "substitution")
    local = Aggregator(dcf, mech, b"t" * 32, "task")
    remote = Aggregator(dcf, mech, b"t" * 32, "task", evaluator=evaluator)
    edges = np.array([10, 60, 61, 200])
    scales = group_scales(1.0, 0.5)
    np.testing.assert_array_equal(remote.group_shares(shards, edges, scales), local.group_shares(shards, edges, scales))
    np.testing.assert_array_equal(remote.prefix_shares(shards, np.arange(256)), local.prefix_shares(shards, np.arange(256)))


def _verified_shares(config, n, party, seed):
    """(report id, stored share) of n honest reports of a verified task for `party`."""
    rng = np.random.default_rng(seed)
    dcf, check = config.key_dcf(), config.check()
    betas, *x = check.client_report(rng.integers(0, 2, (n, check.width)) if check.width == 2 else np.ones((n, 1), np.int64))
    keys = dcf.gen_batch(rng.integers(0, 50, n), betas)
    return [(rng.bytes(16), join_share(keys[party][i].to_bytes(), x[party][i])) for i in range(n)]


@dataclass(frozen=True, eq=False)
class _OnCluster(StepContext):
    round_one_map: object = None  # what `TaskContext` gives round_one.catch_up with --dask


@pytest.mark.parametrize("payload", ["count", "label"])
def test_verified_round_one_on_the_cluster_is_bit_identical_and_gets_no_secret(tmp_path, evaluator, monkeypatch, payload):
    """Round one of a verified task mapped over the cluster as reports arrive: the same per-report
    values and the same close-time view (`prepare`, drops subtracted) as in-process, bit for bit; every
    argument sent to a worker is pickled and holds neither the pair key, the challenges' key nor the
    noise seed (the task's challenges, which the sketch needs, do go: docs/scaling.md)."""
    grid = {"kind": "thresholds", "values": [float(v) for v in range(50)]}
    config = TaskConfig(grid, 1.0, "path", "substitution", 0, ("a", "b"), ("00" * 32, "01" * 32), "00", payload=payload)
    key, seed, party = bytes(range(32)), bytes(range(100, 132)), 1
    items = _verified_shares(config, 500, party, 7)
    monkeypatch.setattr(round_one, "keys_per_pass", lambda size, width: 64)  # in-process: batches of 64 reports
    monkeypatch.setattr(dask_check, "TASK_ELEMENTS", 100 * 50 * config.key_dcf().width)  # Dask: of 100, two in flight
    sent = []
    for name in ("submit", "scatter"):
        real = getattr(evaluator.client, name)
        def record(*a, _real=real, **k):
            sent.append(pickle.dumps((a, k)))
            return _real(*a, **k)

        monkeypatch.setattr(evaluator.client, name, record)
    spool = dask_check.write_secret  # local:N: the batches' shares go by files of the spool
    monkeypatch.setattr(dask_check, "write_secret", lambda path, data: sent.append(bytes(data)) or spool(path, data))
    views, rows = [], []
    for where in ("in-process", "dask"):
        store = Store(tmp_path / f"{where}.sqlite")
        try:
            store.add_task(config.task_id, config.to_json(), b"fp", seed)
            base = StepContext.of(config, party, store, key)
            ctx = base if where == "in-process" else _OnCluster(*vars(base).values(), evaluator.round_one)
            for start in range(0, 500, 150):  # uploads, each followed by the checker's catch-up
                store.add_many(config.task_id, items[start:start + 150])
                round_one.catch_up(ctx)
            rows.append(store.check_batches(config.task_id))
            store.freeze(config.task_id, lambda ids: str(len(ids)))
            store.exclude(config.task_id, [items[3][0], items[420][0]], lambda ids: str(len(ids)))
            views.append(round_one.prepare(ctx))
        finally:
            store.close()
    assert [len(r) for r in rows] == [10, 7]  # cut differently (the last batch of each upload shorter)
    columns = [{f: b"".join(getattr(b, f) for b in r) for f in ("ids", "message", "state", "extras")} for r in rows]
    assert columns[1] == columns[0]  # but each report's round one is the same bytes
    for field in ("ids", "context", "extras", "message", "state", "total"):
        np.testing.assert_array_equal(getattr(views[1], field), getattr(views[0], field))
    assert len(sent) == 1 + 2 * (7 + 1)  # the challenges once; per batch and for the drops' grid sum the shares, then its task
    assert evaluator.spool is not None and [f.name for f in evaluator.spool.iterdir()] == [".lock"]  # each batch file taken (and deleted) by its worker
    assert b"Challenges" in sent[0]
    secrets = (key, round_one.verification_key(key), seed)
    assert not any(secret in blob for blob in sent for secret in secrets)


def test_bad_addresses_are_refused():
    for address in ("local:0", "local:x", "somewhere:8786"):
        with pytest.raises(DaskError):
            DaskEvaluator(address)
    for address in ("tcp://scheduler:8786", "ws://scheduler:8786", "ucx://scheduler:8786"):  # plain: on request only
        with pytest.raises(DaskError, match="refused, not encrypted: .* add --dask-insecure"):
            DaskEvaluator(address)
        check_address(address, insecure=True)
    check_address("tls://scheduler:8786")
    with pytest.raises(DaskError, match="no TLS settings for it .*docs/scaling.md"):  # review: was an unexpected TypeError
        DaskEvaluator("tls://127.0.0.1:9", timeout=2)


def test_dask_over_plain_tcp_only_with_dask_insecure(tmp_path):
    """Issue 42, item 5: whoever reaches a plain scheduler runs code on the workers (which map the
    server's key shares) and, through the results it unpickles, in the server. `dpcdf serve --dask
    tcp://...` is refused with that reason before anything starts; with --dask-insecure it starts."""
    data = tmp_path / "s0"
    refused = dpcdf_cli("serve", "--party", "0", "--port", str(free_port()), "--data", str(data), "--dask",
                        "tcp://127.0.0.1:8786")
    assert refused.returncode != 0
    assert "refused, not encrypted: anyone who reaches a plain scheduler runs code on the workers" in refused.stderr
    assert "--dask-insecure" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert not data.exists()  # refused before the server made anything
    port = free_port()  # a plain scheduler in its own process (an in-process LocalCluster's IO loop did not start,
    address = f"tcp://127.0.0.1:{port}"  # at times, in a pytest-xdist worker that had run other modules)
    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                                  str(port), "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and scheduler.poll() is None, "the scheduler did not start"
            time.sleep(0.2)
        with open(tmp_path / "s0.log", "wb") as log:
            proc, url = start_server(0, str(data), noise=False, log=log, extra_env=TESTING,
                                     args=["--dask", address, "--dask-insecure"])
        try:
            assert http("GET", f"{url}/health")["status"] == "ok"
        finally:
            stop(proc)
        assert f"Dask {address}" in (tmp_path / "s0.log").read_text()
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=30)


def test_two_servers_one_on_a_local_cluster_answer_the_exact_counts(tmp_path):
    """Server 0 evaluates on `--dask local:2`, server 1 in-process; noise off (the test-only switch)."""
    procs = []
    try:
        for party, extra in ((0, ["--dask", "local:2"]), (1, [])):
            log = open(tmp_path / f"s{party}.log", "wb")
            procs.append(start_server(party, str(tmp_path / f"s{party}"), noise=False, log=log, extra_env=TESTING,
                                      args=extra))
        workers = [c for c in psutil.Process(procs[0][0].pid).children(recursive=True)]
        assert len(workers) >= 2  # the LocalCluster's worker processes
        config, token = create_task([u for _, u in procs], GRID, 1.0, "tree", "substitution", min_batch=10,
                                    verify=False)  # Dask evaluates per query: unverified tasks (a verified one answers from its histogram)
        vals = values(400, 5)
        assert submit(config, vals, batch=100)["complete"] == 400
        analyst = Analyst(config, token)
        truth = prefix_counts(vals, config.make_grid())
        counts, n = analyst.prefix_counts(np.arange(64))
        assert n == 400
        np.testing.assert_array_equal(counts, truth)
        np.testing.assert_allclose(analyst.release("monotone").counts, truth, atol=1e-9)  # noise off: the plain fit
        assert (segments.task_dir(tmp_path / "s0", config.task_id) / "00000.cw_seed.npy").exists()
        # a verified task: server 0's round one runs on its workers, and the release is the exact counts
        config, token = create_task([u for _, u in procs], GRID, 1.0, "tree", "substitution", min_batch=10)
        assert config.verify
        assert submit(config, vals, batch=100)["complete"] == 400
        counts, n = Analyst(config, token).prefix_counts(np.arange(64))
        assert n == 400
        np.testing.assert_array_equal(counts, truth)
        db = sqlite3.connect(f"file:{tmp_path / 's0'}/server.sqlite?mode=ro", uri=True)
        try:  # server 0's round one was stored (it answers from the histogram share its workers summed)
            assert db.execute("SELECT sum(n) FROM check_batches WHERE task_id = ?", (config.task_id,)).fetchone()[0] == 400
        finally:
            db.close()
        big = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 17}  # above 2^16: verified only with a cluster
        with pytest.raises(ServerError, match="needs a server with a Dask cluster") as refused:
            create_task([u for _, u in procs], big, 1.0, "path", "substitution", min_batch=10, verify=True)
        assert refused.value.status == 400 and procs[1][1] in str(refused.value)  # server 0 (local:2) took it,
        assert "deleted again on server 0" in str(refused.value)  # and does not keep it alone (review of issue 24)
        listed = http("GET", f"{procs[0][1]}/admin/tasks", token=OPERATOR)["tasks"]
        assert len(listed) == 3 and [t["state"] for t in listed].count("deleted") == 1
    finally:
        for proc, _ in procs:
            stop(proc)
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)  # stopped with the server


def test_a_worker_never_maps_a_segment_other_than_the_recorded_one(tmp_path):
    """A segment file swapped or changed on disk after the server checked it (another task's, say) is
    refused by the worker that maps it, not evaluated (found by a review: workers used it unchecked)."""
    from dpcdf.service.server import dask_eval
    from dpcdf.service.storage import segments

    path = tmp_path / "00000.seeds.npy"
    np.save(path, np.arange(32, dtype=np.uint64))
    good = segments.sha256(path)
    assert np.array_equal(dask_eval._mapped(str(tmp_path), path.name, good), np.arange(32, dtype=np.uint64))
    dask_eval._open.clear()  # a restarted worker
    path.unlink()
    np.save(path, np.arange(32, dtype=np.uint64)[::-1].copy())  # swapped under the same name
    with pytest.raises(segments.SegmentError, match="not the segment the server recorded"):
        dask_eval._mapped(str(tmp_path), path.name, good)
