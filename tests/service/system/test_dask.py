"""Evaluation on Dask: the same shares, bit for bit, as in-process; the noise added on the server."""
import numpy as np
import psutil
import pytest

from dpcdf.analyst import Analyst
from dpcdf.release.calibration import group_scales
from dpcdf.release.ecdf import prefix_counts
from dpcdf.release.mechanisms import PathMechanism, TreeMechanism
from dpcdf.service.storage import segments
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.client import create_task, submit
from dpcdf.service.server.dask_eval import DaskError, DaskEvaluator
from dpcdf.service.processes import start_server, stop
from fss import DCF
from helpers import GRID, TESTING, values


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


def test_bad_addresses_are_refused():
    for address in ("local:0", "local:x", "somewhere:8786"):
        with pytest.raises(DaskError):
            DaskEvaluator(address)


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
