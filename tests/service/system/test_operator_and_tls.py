"""Only the operator registers tasks (401 without its token, 403 with another), through the CLI too;
and the whole protocol runs over HTTPS (`dpcdf serve --tls-cert/--tls-key`), the servers' direct
reconciliation included (real server processes)."""
import datetime
import ipaddress
import os
import subprocess
import sys

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dpcdf.analyst import Analyst
from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import ServerError, http
from dpcdf.service.processes import start_server, stop
from dpcdf.service.task import TaskConfig
from helpers import GRID, TESTING, dpcdf_cli, values


def test_registration_needs_the_operator_token(tmp_path):
    token_file = tmp_path / "operator.token"
    token_file.write_text("a-token-only-the-operator-has-42\n")
    procs = [start_server(p, str(tmp_path / f"s{p}"), noise=False, extra_env=TESTING,
                          args=["--admin-token-file", str(token_file)]) for p in (0, 1)]
    try:
        urls = [u for _, u in procs]
        spec = TaskConfig(GRID, 1.0, "path", "substitution", 1, tuple(urls),
                          tuple(http("GET", f"{u}/hpke")["keys"]["x25519"] for u in urls), "0" * 64).to_json().encode()
        with pytest.raises(ServerError, match="401 registering a task needs the operator's bearer token"):
            http("POST", f"{urls[0]}/tasks", spec)
        with pytest.raises(ServerError, match="403 that is not this server's operator token"):
            create_task(urls, GRID, 1.0, "path", "substitution", 1)  # $DPCDF_ADMIN_TOKEN: not this server's
        config, token = create_task(urls, GRID, 1.0, "path", "substitution", 1, admin_tokens="a-token-only-the-operator-has-42")
        assert http("GET", f"{urls[0]}/tasks/{config.task_id}", token=token)["reports"] == 0  # 201 on both
        run = lambda *extra: subprocess.run([sys.executable, "-m", "dpcdf", "task", "--servers", *urls, "--grid",
                                             "uniform:0:1:4", "--epsilon", "1", "--out", str(tmp_path / "t.json"), *extra],
                                            capture_output=True, text=True, env={**os.environ, "DPCDF_ADMIN_TOKEN": ""})
        refused = run()
        assert refused.returncode == 2 and "needs each server's operator token" in refused.stderr
        made = run("--admin-token-file", str(token_file))
        assert made.returncode == 0, made.stderr
        assert TaskConfig.from_json((tmp_path / "t.json").read_text()).servers == tuple(urls)
    finally:
        for proc, _ in procs:
            stop(proc)


def _self_signed(tmp_path, common_name: str = "dpcdf test"):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


def test_the_protocol_runs_over_https(tmp_path, monkeypatch):
    cert, key = _self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # this test's CA, for the client, the analyst and server 0
    env = {**TESTING, "SSL_CERT_FILE": cert}
    procs = [start_server(p, str(tmp_path / f"s{p}"), noise=False, extra_env=env, args=["--tls-cert", cert, "--tls-key", key])
             for p in (0, 1)]
    try:
        urls = [u for _, u in procs]
        assert all(u.startswith("https://") for u in urls)
        config, token = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1)
        vals = values(50, 33)
        assert submit(config, vals)["complete"] == 50
        analyst = Analyst(config, token)
        assert analyst.close() == 50  # server 0 reached server 1 over HTTPS
        counts, _ = analyst.prefix_counts(range(64))
        np.testing.assert_array_equal(counts, prefix_counts(vals, config.make_grid()))
        monkeypatch.delenv("SSL_CERT_FILE")
        with pytest.raises(ServerError, match="CERTIFICATE_VERIFY_FAILED"):
            http("GET", f"{urls[0]}/health")  # a certificate nobody vouches for is refused
    finally:
        for proc, _ in procs:
            stop(proc)


def test_a_certificate_server_0_does_not_trust_refuses_the_task_at_dpcdf_task(tmp_path, monkeypatch):
    """Issue 46: each server has its own certificate; server 0 started with --ca-file naming only its
    own does not trust server 1's, so `dpcdf task` fails at once, naming server 1 and the certificate
    (before, the task registered and failed at the close, after every upload). Server 0 restarted
    with the right CA file: the same command registers the task, and the protocol runs over HTTPS."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cert0, key0 = _self_signed(tmp_path / "a", "dpcdf test server 0")  # two names: a bundle finds each issuer by it
    cert1, key1 = _self_signed(tmp_path / "b", "dpcdf test server 1")
    both = tmp_path / "both.pem"
    both.write_text(open(cert0).read() + open(cert1).read())
    monkeypatch.setenv("DPCDF_CA_FILE", str(both))  # this test process (start_server's health checks) trusts both
    tls = [["--tls-cert", cert0, "--tls-key", key0], ["--tls-cert", cert1, "--tls-key", key1]]
    procs = [start_server(0, str(tmp_path / "s0"), noise=False, extra_env=TESTING, args=[*tls[0], "--ca-file", cert0]),
             start_server(1, str(tmp_path / "s1"), noise=False, extra_env=TESTING, args=tls[1])]
    try:
        urls = [u for _, u in procs]
        task = ["--ca-file", str(both), "task", "--servers", *urls, "--grid", "uniform:0:100:6", "--epsilon", "1",
                "--mechanism", "tree", "--min-batch", "1", "--out", str(tmp_path / "task.json")]
        refused = dpcdf_cli(*task)
        assert refused.returncode == 2 and "server 0 cannot reach server 1" in refused.stderr, refused.stderr
        assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr and not (tmp_path / "task.json").exists()
        stop(procs[0][0])
        procs[0] = start_server(0, str(tmp_path / "s0"), noise=False, extra_env=TESTING, port=int(urls[0].rsplit(":", 1)[1]),
                                args=[*tls[0], "--ca-file", str(both)])
        made = dpcdf_cli(*task)
        assert made.returncode == 0, made.stderr
        data = tmp_path / "v.csv"
        data.write_text("x\n" + "\n".join(f"{v:.4f}" for v in values(20, 4)))
        assert dpcdf_cli("--ca-file", str(both), "submit", "--task", str(tmp_path / "task.json"), "--csv", str(data),
                         "--column", "x").returncode == 0
        closed = dpcdf_cli("--ca-file", str(both), "close", "--task", str(tmp_path / "task.json"))
        assert closed.returncode == 0 and "20 reports counted" in closed.stdout, closed.stderr  # server 0 -> 1 over HTTPS
    finally:
        for proc, _ in procs:
            stop(proc)
