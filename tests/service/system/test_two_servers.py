"""The two-server system end to end: real server processes on loopback, real HPKE, real SQLite."""
import http.client as http_client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from fss import field as F
import pytest

from dpcdf.service.server.aggregate import Aggregator
from dpcdf.analyst import Analyst
from dpcdf.service.http import ServerError, http
from dpcdf.service.client import create_task, submit
from dpcdf.service.client import make_reports
from dpcdf.service.wire import encode_batch
from dpcdf.service.processes import start_server, stop
from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.task import TaskConfig
from helpers import GRID, OPERATOR, urls, values


def _signed(agg, shares):
    """One server's shares read as signed integers (its noise alone, when it has no keys)."""
    return F.signed(shares) if agg.prime else shares.view(np.int64)


@pytest.mark.parametrize("mechanism,kem", [("path", "x25519"), ("tree", "x25519"), ("tree", "mlkem768-x25519")])

def test_without_noise_answers_are_the_exact_counts(servers, mechanism, kem):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, mechanism, "substitution", min_batch=10, kem=kem)
    vals = values(150, 1)
    assert submit(config, vals, batch=40)["complete"] == 150
    analyst = Analyst(config, token)
    grid = config.make_grid()
    truth = prefix_counts(vals, grid)
    idx = [0, 5, 31, 32, 63]
    counts, n = analyst.prefix_counts(idx)
    assert n == 150
    np.testing.assert_array_equal(counts, truth[idx])
    rel = analyst.release("monotone")  # the default smooths tree releases, assuming noise; these servers add none
    np.testing.assert_allclose(rel.counts, truth)
    np.testing.assert_allclose(rel.raw, truth)


def _seed(data_dir: Path, task_id: str) -> bytes:
    db = sqlite3.connect(str(data_dir / "server.sqlite"))
    (seed,) = db.execute("SELECT noise_seed FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    db.close()
    return bytes(seed)


@pytest.mark.parametrize("mechanism", ["path", "tree"])
def test_with_noise_answers_are_counts_plus_both_servers_noise(servers, mechanism):
    """White box: the noise each server added is what its secret seed derives for those nodes."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = create_task(urls(pair), GRID, 0.5, mechanism, "substitution", min_batch=10)
    vals = values(120, 2)
    submit(config, vals)
    idx = np.array([0, 7, 40, 63])
    counts, _ = Analyst(config, token).prefix_counts(idx)
    truth = prefix_counts(vals, config.make_grid())[idx]
    noise = np.zeros(idx.size, np.int64)
    for party, (_, _, data_dir) in enumerate(pair):
        agg = Aggregator(config.dcf(), config.make_mechanism(), _seed(data_dir, config.task_id), config.task_id)
        zero = _signed(agg, agg.prefix_shares([], idx))  # no keys: the noise alone
        noise += zero
    np.testing.assert_array_equal(counts, truth + noise)
    assert np.any(noise != 0)
    again, _ = Analyst(config, token).prefix_counts(idx)
    np.testing.assert_array_equal(again, counts)  # the same answer every time: fixed node noise


def test_replay_is_counted_once_and_bad_reports_are_refused(servers):
    procs, _ = servers
    pair = urls(procs["exact"])
    config, token = create_task(pair, GRID, 1.0, "path", "substitution", min_batch=1)
    other, _ = create_task(pair, GRID, 1.0, "path", "substitution", min_batch=1)
    good = make_reports(config, [10.0, 20.0])
    raw = good[0].to_bytes()
    url = f"{pair[0]}/tasks/{config.task_id}/reports"
    assert http("POST", url, raw, content_type="application/octet-stream") == {"accepted": 1}
    with pytest.raises(ServerError, match="409 duplicate report id"):
        http("POST", url, raw, content_type="application/octet-stream")
    flipped = bytearray(good[1].to_bytes())
    flipped[4 + 32 + 16 + 2 + 32 + 4 + 10] ^= 1  # inside server 0's ciphertext
    foreign = make_reports(other, [5.0])[0].to_bytes()
    cases = {
        "400 not a dpcdf report": os.urandom(200),
        "400 truncated report": good[1].to_bytes()[:-5],
        "400 the share does not open": bytes(flipped),
        "400 report is for another task": foreign,
        "400 1 trailing bytes": good[1].to_bytes() + b"x",
    }
    for message, body in cases.items():
        with pytest.raises(ServerError, match=message):
            http("POST", url, body, content_type="application/octet-stream")
    host, port = pair[0].rsplit("/", 1)[1].split(":")
    conn = http_client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", f"/tasks/{config.task_id}/reports")
    conn.putheader("Content-Length", str(65 << 20))  # announced, never sent: refused before reading
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and b"over" in resp.read()
    conn.close()
    batch = encode_batch([raw, good[1].to_bytes(), bytes(flipped)])
    res = http("POST", url + "/batch", batch, content_type="application/octet-stream")
    assert (res["accepted"], res["duplicates"], len(res["rejected"])) == (1, 1, 1)
    status = http("GET", f"{pair[0]}/tasks/{config.task_id}", token=token)
    assert status["reports"] == 2
    assert http("GET", f"{pair[0]}/health")["status"] == "ok"


def test_queries_need_the_token_the_task_and_enough_reports(servers):
    procs, _ = servers
    pair = urls(procs["exact"])
    config, token = create_task(pair, GRID, 1.0, "path", "substitution", min_batch=50)
    submit(config, values(20, 3))
    q = b'{"kind": "prefix", "indices": [1]}'
    base = f"{pair[0]}/tasks/{config.task_id}/query"
    with pytest.raises(ServerError, match="401"):
        http("POST", base, q)
    with pytest.raises(ServerError, match="401"):
        http("POST", base, q, token="wrong")
    with pytest.raises(ServerError, match="403 the task has 20 reports; queries need at least 50"):
        http("POST", f"{pair[0]}/tasks/{config.task_id}/close", b"{}", token=token)
    with pytest.raises(ServerError, match="409 the task is not closed"):
        http("POST", base, q, token=token)
    with pytest.raises(ServerError, match="401 the analyst's bearer token is required"):
        http("POST", f"{pair[0]}/tasks/{'0' * 32}/query", q, token=token)  # an unknown task looks like a wrong token
    submit(config, values(40, 4))
    with pytest.raises(ServerError, match="400 indices must be"):
        http("POST", base, b'{"kind": "prefix", "indices": [64]}', token=token)
    with pytest.raises(ServerError, match="400 kind must be"):
        http("POST", base, b'{"kind": "everything"}', token=token)
    with pytest.raises(ServerError, match="400 the body must be JSON"):
        http("POST", base, b"not json", token=token)
    with pytest.raises(ServerError, match="400 the body must be JSON"):
        http("POST", base, b"[" * 100000, token=token)
    with pytest.raises(ServerError, match="400 at most 65536 indices"):
        http("POST", base, json.dumps({"kind": "prefix", "indices": [1] * 65537}).encode(), token=token)
    with pytest.raises(ServerError, match="400 not a task configuration"):
        http("POST", f"{pair[0]}/tasks", b"{}", OPERATOR)
    with pytest.raises(ServerError, match="400 not a task configuration"):
        http("POST", f"{pair[0]}/tasks", b"[" * 100000, OPERATOR)
    # none of the refused queries closed the collection: uploads still go in
    status = http("GET", f"{pair[0]}/tasks/{config.task_id}", token=token)
    assert status["closed"] is False
    submit(config, values(1, 5))


def test_secrets_never_reach_logs_or_responses(servers):
    procs, base = servers
    pair = procs["noisy"]
    config, token = create_task(urls(pair), GRID, 1.0, "tree", "substitution", min_batch=1)
    submit(config, values(30, 5))
    Analyst(config, token).close()
    answers = [str(http("POST", f"{u}/tasks/{config.task_id}/query", b'{"kind": "nodes", "level": 0}', token)) for u in urls(pair)]
    answers += [str(http("GET", f"{u}/hpke")) for u in urls(pair)]
    for party, (_, _, data_dir) in enumerate(pair):
        seed = _seed(data_dir, config.task_id).hex()
        db = sqlite3.connect(str(data_dir / "server.sqlite"))
        share = bytes(db.execute("SELECT key_share FROM reports LIMIT 1").fetchone()[0]).hex()
        db.close()
        pem = (data_dir / "hpke_x25519.pem").read_text().splitlines()[1]
        mlkem_seed = (data_dir / "hpke_mlkem768.seed").read_bytes().hex()
        log = (base / f"noisy{party}.log").read_text()
        for secret in (seed, share[16:80], pem, mlkem_seed):
            assert secret not in log
            assert all(secret not in a for a in answers)


def test_noise_off_is_refused_outside_tests(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DPCDF_TESTING"}
    out = subprocess.run([sys.executable, "-m", "dpcdf", "serve", "--party", "0", "--port", "1", "--data", str(tmp_path),
                          "--no-noise"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0 and "test-only setting" in out.stderr


def test_kill_9_loses_no_acknowledged_report_and_counts_none_twice(tmp_path):
    log = open(tmp_path / "log", "wb")
    procs = [start_server(party, str(tmp_path / f"s{party}"), log=log) for party in (0, 1)]
    config, token = create_task([u for _, u in procs], GRID, 1.0, "path", "substitution", min_batch=1)
    reports = make_reports(config, values(400, 6))
    acked: list[bytes] = []
    url0 = f"{procs[0][1]}/tasks/{config.task_id}/reports"

    def upload():
        for r in reports:
            try:
                http("POST", url0, r.to_bytes(), content_type="application/octet-stream", timeout=5)
                acked.append(r.report_id)
            except ServerError:
                return

    thread = threading.Thread(target=upload)
    thread.start()
    while len(acked) < 50:
        time.sleep(0.01)
    os.kill(procs[0][0].pid, signal.SIGKILL)
    procs[0][0].wait()
    thread.join(30)
    assert 50 <= len(acked) < len(reports)
    restarted, url = start_server(0, str(tmp_path / "s0"), port=int(procs[0][1].rsplit(":", 1)[1]), log=log)
    try:
        db = sqlite3.connect(str(tmp_path / "s0" / "server.sqlite"))
        stored = {bytes(r[0]) for r in db.execute("SELECT report_id FROM reports")}
        assert set(acked) <= stored
        # the client retries everything: nothing is counted twice
        dup = 0
        for r in reports:
            try:
                http("POST", url0, r.to_bytes(), content_type="application/octet-stream")
            except ServerError as exc:
                assert "409" in str(exc)
                dup += 1
        assert dup == len(stored)
        (count,) = db.execute("SELECT COUNT(*) FROM reports").fetchone()
        assert count == len(reports)
        db.close()
    finally:
        stop(restarted)
        stop(procs[1][0])


def test_two_server_error_is_twice_the_central_variance():
    """Each server adds its own full noise: the sum of two independent seeds' noise at a prefix has
    twice the central variance (many tasks, in process, same code as the servers)."""
    config = TaskConfig(GRID, 1.0, "path", "substitution", 1, ("a", "b"), ("00", "01"), "00")
    mech = config.make_mechanism()
    idx = np.arange(64)
    sums = []
    for t in range(300):
        total = np.zeros(idx.size, np.int64)
        for party in (0, 1):
            agg = Aggregator(config.dcf(), mech, os.urandom(32), f"task{t}")
            total += _signed(agg, agg.prefix_shares([], idx))
        sums.append(total)
    per_prefix = np.var(np.array(sums, dtype=np.float64), axis=0).mean()
    assert per_prefix == pytest.approx(2 * mech.expected_mse(), rel=0.15)


def test_cli_query_prints_quantiles(servers, tmp_path):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "tree", "substitution", min_batch=1)
    csv = tmp_path / "v.csv"
    csv.write_text("x\n" + "\n".join(str(v) for v in values(60, 7)))
    (tmp_path / "task.json").write_text(config.to_json())
    (tmp_path / "task.json.token").write_text(token)
    run = lambda *a: subprocess.run([sys.executable, "-m", "dpcdf", *a], capture_output=True, text=True, timeout=300)  # noqa: E731
    sub = run("submit", "--task", str(tmp_path / "task.json"), "--csv", str(csv), "--column", "x")
    assert sub.returncode == 0 and '"complete": 60' in sub.stdout
    q = run("query", "--task", str(tmp_path / "task.json"), "--ecdf", "50", "--quantiles", "0.5", "--postprocess", "monotone")
    assert q.returncode == 0 and "q(0.5) =" in q.stdout and "DP under substitution" in q.stdout
    assert "verified: the servers checked every report; excluded 0" in q.stdout
    # issue 46: 50 lies between the thresholds 49.21 and 50.79 of this grid: the line says which one F(50)
    # read, and its band (an interval, not +/-) spans both, so it contains the data's own F(50)
    line = q.stdout.split("F(50) = ")[1].splitlines()[0]
    assert "read at the threshold 49.2063" in line and "+/-" not in line
    lo, hi = (float(x) for x in line.split("simultaneous band ")[1].split(" to "))
    assert lo <= float(np.mean(values(60, 7) <= 50)) <= hi
    # --json: the Python API's numbers, one JSON object (issue 46)
    j = run("query", "--task", str(tmp_path / "task.json"), "--ecdf", "50", "-5", "--quantiles", "0.5", "--json")
    assert j.returncode == 0, j.stderr
    got = json.loads(j.stdout)
    rel = Analyst.from_task_file(str(tmp_path / "task.json")).release()  # the files the CLI read, the token beside them
    lo_hi = rel.confidence_band(0.95, ts=[50, -5])
    assert [e["F"] for e in got["ecdf"]] == rel.ecdf([50, -5]).tolist() and got["ecdf"][1]["read_at"] is None
    assert got["ecdf"][0]["read_at"] == rel.read_at([50])[0] and got["ecdf"][0]["band95"] == [lo_hi[0][0], lo_hi[1][0]]
    assert got["quantiles"] == [{"p": 0.5, "q": float(rel.quantile([0.5])[0])}] and got["task_id"] == config.task_id
    bad = run("query", "--task", str(tmp_path / "task.json"), "--roc", "--json")
    assert bad.returncode != 0 and "--json prints ECDF values" in bad.stderr
    # --csv and --plot (issue 46): a wrong path is refused before anything, the same command then works
    bad = run("query", "--task", str(tmp_path / "task.json"), "--plot", str(tmp_path / "no" / "such" / "f.png"))
    assert bad.returncode == 2 and "--plot: cannot write" in bad.stderr
    kept = run("query", "--task", str(tmp_path / "task.json"), "--csv", str(tmp_path / "f.csv"), "--plot", str(tmp_path / "f.png"))
    assert kept.returncode == 0, kept.stderr
    rows = np.loadtxt(tmp_path / "f.csv", delimiter=",", skiprows=1)
    lo_all, hi_all = rel.confidence_band(0.95)
    assert (tmp_path / "f.csv").read_text().splitlines()[0] == "threshold,F,band95_lower,band95_upper"
    np.testing.assert_array_equal(rows, np.column_stack([rel.grid.thresholds, rel.cdf(), lo_all, hi_all]))
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    b = run("query", "--task", str(tmp_path / "task.json"), "--quantiles", "0.5", "--bisect")
    assert b.returncode == 0 and b.stdout.split("q(0.5) = ")[1].split()[0] == q.stdout.split("q(0.5) = ")[1].split()[0]


def test_demo_runs_and_plots(tmp_path):
    from dpcdf.demo import run_demo

    # warm=False: `dpcdf warm-up`'s own test (test_cli_errors) covers the warm-up; the servers still load their kernels
    out = run_demo(clients=400, epsilon=1.0, mechanism="tree", plot=str(tmp_path / "demo.png"), warm=False)
    assert (tmp_path / "demo.png").stat().st_size > 1000
    # 400 values, eps 1, both servers' noise: KS has median 0.11 and exceeded 0.2 in 1.8% of 1,500 simulated
    # releases (max 0.246), so 0.3 fails only for a real error (half the reports lost puts it near 0.5)
    assert out["metrics"]["KS"] < 0.3


@pytest.mark.parametrize("mechanism", ["path", "tree"])
def test_two_server_roc_without_noise_is_scikit_learns(servers, mechanism):
    from sklearn.metrics import roc_auc_score

    procs, _ = servers
    rng = np.random.default_rng(8)
    labels = rng.integers(0, 2, 200)
    scores = np.clip(rng.normal(40 + 20 * labels, 15), 0, 100)
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, mechanism, "substitution", min_batch=10, payload="label")
    submit(config, scores, labels=labels)
    r = Analyst(config, token).roc()
    grid_scores = config.make_grid().thresholds[config.make_grid().index(scores)]  # what the grid resolves
    assert r.auc == pytest.approx(roc_auc_score(labels, grid_scores), abs=1e-12)
    with pytest.raises(Exception, match="ROC curve"):
        Analyst(config, token).release()


def test_two_server_roc_with_noise_is_close(servers, tmp_path):
    from sklearn.metrics import roc_auc_score

    procs, _ = servers
    rng = np.random.default_rng(9)
    labels = rng.integers(0, 2, 1500)
    scores = np.clip(rng.normal(40 + 20 * labels, 15), 0, 100)
    config, token = create_task(urls(procs["noisy"]), GRID, 2.0, "tree", "substitution", min_batch=10, payload="label")
    submit(config, scores, labels=labels)
    r = Analyst(config, token).roc()
    assert abs(r.auc - roc_auc_score(labels, scores)) < 0.05
    assert np.all(np.diff(r.tpr) <= 1e-12) and np.all(np.diff(r.fpr) <= 1e-12)  # monotone in the threshold
    # the CLI prints each point with its band, and keeps the curve with its band (issue 46)
    task = tmp_path / "label.json"
    task.write_text(config.to_json())
    (tmp_path / "label.json.token").write_text(token)
    q = subprocess.run([sys.executable, "-m", "dpcdf", "query", "--task", str(task), "--roc", "--csv", str(tmp_path / "roc.csv"),
                        "--plot", str(tmp_path / "roc.png")], capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr
    assert f"AUC = {r.auc:.4f}" in q.stdout and "95% simultaneous bands" in q.stdout
    rows = np.loadtxt(tmp_path / "roc.csv", delimiter=",", skiprows=1)
    np.testing.assert_array_equal(rows[:, [1, 4]], np.column_stack([r.fpr, r.tpr]))
    f_lo, f_hi, t_lo, t_hi = r.band(0.95)
    np.testing.assert_array_equal(rows[:, [2, 3, 5, 6]], np.column_stack([f_lo, f_hi, t_lo, t_hi]))
    assert (tmp_path / "roc.png").read_bytes()[:4] == b"\x89PNG"


def test_two_server_hosmer_lemeshow_matches_the_central_one_and_spends_its_budget_once(servers):
    from dpcdf.apps.hosmer_lemeshow import exact_hosmer_lemeshow

    procs, _ = servers
    rng = np.random.default_rng(10)
    p = rng.beta(2, 2, 800)
    y = (rng.random(800) < p).astype(int)
    grid = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 8}
    config, token = create_task(urls(procs["exact"]), grid, 1.0, "tree", "substitution", min_batch=10, payload="calibration")
    submit(config, p, labels=y)
    analyst = Analyst(config, token)
    hl = analyst.hosmer_lemeshow()
    central = exact_hosmer_lemeshow(p, y, hl.boundaries)
    assert hl.statistic == pytest.approx(central, rel=1e-3)  # E is summed in units of 2^-16
    assert hl.counts.sum() == 800 and hl.dropped == 0
    assert analyst.hosmer_lemeshow().statistic == hl.statistic  # the same question: the same answer
    with pytest.raises(ServerError, match="403 this task's groups are already released"):
        http("POST", f"{config.servers[0]}/tasks/{config.task_id}/query", b'{"kind": "groups", "edges": [1, 2]}', token)
    ecdf_only = http("POST", f"{config.servers[0]}/tasks/{config.task_id}/query", b'{"kind": "prefix", "indices": [3]}', token)
    assert ecdf_only["width"] == 1  # labels and probabilities leave the server only as group sums


def test_add_remove_tasks_do_not_reveal_the_number_of_reports(servers):
    procs, _ = servers
    for gate in (30, 1):
        with pytest.raises(Exception, match="min_batch=0"):
            create_task(urls(procs["noisy"]), GRID, 1.0, "tree", "add-remove", min_batch=gate)
    empty, empty_token = create_task(urls(procs["noisy"]), GRID, 1.0, "tree", "add-remove", min_batch=0)
    counts, _ = Analyst(empty, empty_token).prefix_counts([5, 63])  # no gate: no reports is answered like any count
    assert counts.shape == (2,)
    config, token = create_task(urls(procs["noisy"]), GRID, 0.01, "tree", "add-remove", min_batch=0)
    submit(config, values(60, 12))
    Analyst(config, token).close()
    answer = http("POST", f"{config.servers[0]}/tasks/{config.task_id}/query", b'{"kind": "prefix", "indices": [1]}', token)
    assert answer["n"] is None
    status = http("GET", f"{config.servers[0]}/tasks/{config.task_id}", token=token)
    assert status["reports"] is None and status["closed"] is True
    root = config.make_mechanism().shape.height  # released under add/remove, but noised (its own share of epsilon)
    n_noisy, n_public = Analyst(config, token)._ask({"kind": "nodes", "level": root})
    noise = sum(_signed(agg, agg.node_shares([], root))[0] for agg in (
        Aggregator(config.dcf(), config.make_mechanism(), _seed(d, config.task_id), config.task_id) for _, _, d in procs["noisy"]))
    assert n_noisy.tolist() == [60 + noise] and n_public == 0  # n leaves a server only with its noise
    with pytest.raises(ServerError, match="400 node queries need the tree mechanism and a released level"):
        http("POST", f"{config.servers[0]}/tasks/{config.task_id}/query", ('{"kind": "nodes", "level": %d}' % (root + 1)).encode(), token)
    rel = Analyst(config, token).release()
    assert np.isfinite(rel.total)  # estimated from the noisy counts, not read off the server
    smooth = Analyst(config, token).release(postprocess_with="smooth")  # the same answers, post-processed
    np.testing.assert_array_equal(smooth.fitted, rel.fitted)
    assert np.all(np.diff(smooth.counts) >= 0) and smooth.statement == rel.statement


def test_the_first_query_closes_collection_so_differences_leak_nothing(servers):
    """The attack the fixed per-node noise invites on a growing data set: query, add one report,
    query again, subtract. Collection closes at the first query, so the second upload is refused."""
    procs, _ = servers
    config, token = create_task(urls(procs["noisy"]), GRID, 1.0, "path", "substitution", min_batch=10)
    submit(config, values(50, 13))
    analyst = Analyst(config, token)
    before, _ = analyst.prefix_counts(range(64))
    with pytest.raises(ServerError, match="409 collection is closed"):
        submit(config, [42.0])
    after, _ = analyst.prefix_counts(range(64))
    np.testing.assert_array_equal(after, before)


def test_analyst_ecdf_and_bisection_quantiles_without_a_full_release(servers):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "tree", "substitution", min_batch=1)
    vals = values(300, 15)
    submit(config, vals)
    analyst = Analyst(config, token)
    grid = config.make_grid()
    quantized = grid.thresholds[grid.index(vals)]  # what the grid resolves
    ps = [0.01, 0.1, 0.5, 0.9, 1.0]
    np.testing.assert_array_equal(analyst.quantile(ps), np.quantile(quantized, ps, method="inverted_cdf"))
    ts = np.array([-5.0, 10.0, 50.0, 100.0])
    want = [(quantized <= t).mean() for t in ts]  # the ECDF is a step function at the thresholds
    np.testing.assert_allclose(analyst.ecdf(ts), want)
