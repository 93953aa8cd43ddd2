"""Reports: the wire format, and standard RFC 9180 sealing (another implementation opens them)."""
import json

import numpy as np
import pytest
from Crypto.Protocol import HPKE
from Crypto.PublicKey import ECC
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from dpcdf.service.client import make_reports
from dpcdf.service.wire import MAX_BATCH, Report, ReportError, decode_batch, encode_batch, hpke_info, open_share, split_share
from dpcdf.service.task import TaskConfig

GRID = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 8}


def _config():
    keys = [x25519.X25519PrivateKey.generate() for _ in range(2)]
    pubs = tuple(k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex() for k in keys)
    return TaskConfig(GRID, 1.0, "path", "substitution", 1, ("a", "b"), pubs, "00"), keys


def test_shares_open_for_their_server_and_add_up_to_the_comparison():
    config, keys = _config()
    reports = make_reports(config, [0.3, 0.9])
    dcf = config.key_dcf()  # a verified task's keys: (1, kappa), the report and the check's MAC
    for r, v in zip(reports, (0.3, 0.9)):
        back = Report.from_bytes(r.to_bytes())
        extras = config.extras_bytes // 8
        k0 = dcf.key_from_bytes(split_share(open_share(back, 0, keys[0], config.fingerprint), dcf.key_size, extras)[0], party=0)
        k1 = dcf.key_from_bytes(split_share(open_share(back, 1, keys[1], config.fingerprint), dcf.key_size, extras)[0], party=1)
        a = config.make_grid().index([v])[0]
        for t in (a - 1, a, a + 1):
            value, tag = dcf.reconstruct(dcf.eval(k0, t), dcf.eval(k1, t))
            assert value == int(t >= a) and (tag != 0) == (t >= a)
        with pytest.raises(ReportError, match="does not open"):
            open_share(back, 0, keys[1], config.fingerprint)  # server 1's key cannot open server 0's share
    other, _ = _config()
    with pytest.raises(ReportError, match="another task"):
        open_share(reports[0], 0, keys[0], other.fingerprint)


def test_hybrid_kem_shares_open_and_x25519_keys_do_not_fit(tmp_path):
    from dpcdf.service.hpke import ServerKeys

    for p in (0, 1):
        (tmp_path / f"s{p}").mkdir()
    servers = [ServerKeys(tmp_path / f"s{p}") for p in (0, 1)]
    pubs = tuple(k.public_hex("mlkem768-x25519") for k in servers)
    config = TaskConfig(GRID, 1.0, "path", "substitution", 1, ("a", "b"), pubs, "00", kem="mlkem768-x25519")
    report = Report.from_bytes(make_reports(config, [0.4])[0].to_bytes())
    assert len(report.sealed[0][0]) == 1120  # ML-KEM-768 ciphertext + X25519 share
    for party in (0, 1):
        share = open_share(report, party, servers[party].private("mlkem768-x25519"), config.fingerprint, "mlkem768-x25519")
        config.key_dcf().key_from_bytes(split_share(share, config.key_dcf().key_size, config.extras_bytes // 8)[0], party=party)
    with pytest.raises(ReportError, match="must be 32 bytes"):
        open_share(report, 0, servers[0].private("x25519"), config.fingerprint, "x25519")
    again = ServerKeys(tmp_path / "s0")  # the keys persist across restarts
    assert again.public_hex("mlkem768-x25519") == pubs[0]


def test_another_rfc_9180_implementation_opens_our_shares():
    """pycryptodome's HPKE (DHKEM X25519, HKDF-SHA256, AES-128-GCM, base mode) opens what we seal."""
    config, keys = _config()
    report = make_reports(config, [0.5])[0]
    pem = keys[0].private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    theirs = ECC.import_key(pem)
    enc, ct = report.sealed[0]
    ctx = HPKE.new(receiver_key=theirs, aead_id=HPKE.AEAD.AES128_GCM, enc=enc, info=hpke_info(config.fingerprint, report.report_id, 0))
    assert ctx.unseal(ct, b"") == open_share(report, 0, keys[0], config.fingerprint)


def test_batch_codec_and_its_errors():
    config, _ = _config()
    raws = [r.to_bytes() for r in make_reports(config, np.linspace(0, 1, 5))]
    assert decode_batch(encode_batch(raws)) == raws
    for bad in (b"", b"\x05\x00\x00\x00", encode_batch(raws)[:-1], encode_batch(raws) + b"x"):
        with pytest.raises(ReportError):
            decode_batch(bad)
    huge = (MAX_BATCH + 1).to_bytes(4, "little") + b"\0\0\0\0" * (MAX_BATCH + 1)  # a million empty items took 10 s
    with pytest.raises(ReportError, match=f"at most {MAX_BATCH} reports per batch"):
        decode_batch(huge)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"grid": [1, 2]}, "grid must be an object"),
        ({"grid": {"kind": "uniform", "lo": 0, "hi": 1, "bits": "x"}}, "not a uniform grid"),
        ({"grid": {"kind": "uniform", "lo": 0, "hi": 1, "bits": 24}}, "up to 1048576 points"),
        ({"task_id": ["a"]}, "task_id must be"),
        ({"task_id": "../x"}, "task_id must be"),
        ({"token_hash": 5}, "strings"),
        ({"epsilon": 1e13}, "out of range"),
        ({"payload": "calibration", "split": 1e-9}, "epsilon must be at least"),
    ],
)
def test_task_configs_that_cannot_work_are_refused_when_made(change, message):
    """A server answers 400 to these at registration instead of failing at the first query."""
    from dpcdf.errors import ParameterError

    base = json.loads(_config()[0].to_json()) | {"mechanism": "tree"}
    with pytest.raises(ParameterError, match=message):
        TaskConfig.from_json(json.dumps(base | change))
    with pytest.raises(ParameterError, match="not a task configuration"):
        TaskConfig.from_json("[" * 100000)


def test_the_batch_layout_takes_exactly_the_reports_the_parser_takes():
    """`wire.Layout` (a batch's framing checked at once) says yes to a report exactly when
    `Report.from_bytes` reads it with this task's fingerprint and both shares of the task's lengths,
    and then finds the same id and share; `split_shares` refuses what `split_share` refuses, with
    its message. Mutations: every framing byte changed, bytes cut or added, the shares' lengths
    traded between them, another task's report."""
    from dpcdf.service.wire import Layout, split_shares

    config, keys = _config()
    good = [r.to_bytes() for r in make_reports(config, [0.1, 0.5])]
    enc_len, ct_len = (len(x) for x in Report.from_bytes(good[0]).sealed[0])
    layout = Layout(config.fingerprint, enc_len, ct_len)
    share = 2 + enc_len + 4 + ct_len
    raws = list(good) + [r.to_bytes() for r in make_reports(_config()[0], [0.2])]
    framing = [*range(0, 60), *range(52 + enc_len, 60 + enc_len), *range(52 + share, 60 + share),
               *range(52 + share + enc_len, 60 + share + enc_len)]
    for at in framing:
        for delta in (1, 255):
            b = bytearray(good[0])
            b[at] = (b[at] + delta) % 256
            raws.append(bytes(b))
    raws += [good[0][:-1], good[0] + b"x", good[0][:52] + good[0][52:].replace(bytes([enc_len, 0]), bytes([enc_len + 1, 0]), 1)]
    traded = bytearray(good[1])  # share 0's enc one byte longer and its ciphertext one shorter: parses, wrong lengths
    traded[52:54] = (enc_len + 1).to_bytes(2, "little")
    traded[53 + enc_len + 1 : 57 + enc_len + 1] = (ct_len - 1).to_bytes(4, "little")
    raws.append(bytes(traded))
    fits = layout.matches(raws)
    assert fits[:2] == [True, True] and not all(fits)
    for raw, fit in zip(raws, fits):
        try:
            r = Report.from_bytes(raw)
            parsed = r.fingerprint == config.fingerprint and all(len(e) == enc_len and len(c) == ct_len for e, c in r.sealed)
        except ReportError:
            parsed = False
        assert fit == parsed, raw.hex()
        if fit:
            for party in (0, 1):
                assert layout.sealed(raw, party) == (r.report_id, r.sealed[party][0] + r.sealed[party][1])
    size, extras = config.key_dcf().key_size, config.extras_bytes // 8
    opened = [open_share(Report.from_bytes(good[0]), 0, keys[0], config.fingerprint)] * 4
    opened[1] = opened[1][:-8] + (2**61 - 1).to_bytes(8, "little")  # p itself is not a field element
    opened[2] = opened[2] + b"\x00"
    fine, rows, bad = split_shares(opened, size, extras)
    assert fine == [0, 3] and rows.tobytes() == split_share(opened[0], size, extras)[0] * 2
    for i in (1, 2):
        with pytest.raises(ReportError) as info:
            split_share(opened[i], size, extras)
        assert bad[i] == str(info.value)


def test_a_refusal_reads_the_addresss_allowance_again_before_the_next_open(tmp_path, monkeypatch):
    """The upload path reads the address's refusal allowance once per RECHECK opens, and again after
    each refusal: failures another request of the same address charged meanwhile stop this batch
    before it opens another share (review of the batch path: a local count of this batch's own
    refusals let it open up to 63 more)."""
    import secrets
    import warnings

    from dpcdf.service import wire
    from dpcdf.service.server import create_app
    from dpcdf.service.task import token_hash
    from helpers import OPERATOR

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx2")
        from fastapi.testclient import TestClient

    app = create_app(0, tmp_path, warm_up=False, sweep_every=1e9)
    client = TestClient(app)
    pub = client.get("/hpke").json()["keys"]["x25519"]
    config = TaskConfig(GRID, 1.0, "path", "substitution", 1, ("a", "b"), (pub, _config()[0].hpke_keys[1]), token_hash("t"),
                        verify=False)
    assert client.post("/tasks", content=config.to_json(), headers={"authorization": f"Bearer {OPERATOR}",
                                                                    "content-type": "application/json"}).status_code == 201
    good = [r.to_bytes() for r in make_reports(config, [0.5] * 8)]
    bad = [g[:36] + secrets.token_bytes(16) + g[52:] for g in good[:2]]  # another id: the share does not open
    failures, opens, real = app.state.failures, [], wire.Opener.__call__

    def opener(self, rid, sealed):
        opens.append(rid)
        if len(opens) == 2:  # another request of this address used up its allowance meanwhile
            failures.charge("testclient", failures.allowance("testclient"))
        return real(self, rid, sealed)

    monkeypatch.setattr(wire.Opener, "__call__", opener)
    res = client.post(f"/tasks/{config.task_id}/reports/batch", content=encode_batch(bad + good))
    assert res.status_code == 429, res.text
    assert len(opens) == 2  # the second refusal's read found nothing left: no good report opened
