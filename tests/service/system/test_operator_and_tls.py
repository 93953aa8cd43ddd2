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
from helpers import GRID, TESTING, values


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


def _self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dpcdf test")])
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
