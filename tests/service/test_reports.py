"""Reports: the wire format (2, and 1 still read), and standard RFC 9180 sealing and AES-GCM (another
implementation opens them)."""
import json

import numpy as np
import pytest
from Crypto.Protocol import HPKE
from Crypto.PublicKey import ECC
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from dpcdf.service.client import make_reports
from dpcdf.service import hpke
from dpcdf.service.wire import (MAX_BATCH, Opener, Report, ReportError, capsule_info, decode_batch, encode_batch,
                                open_share, share_aad, split_share)
from dpcdf.service.task import TaskConfig
from helpers import v1_report

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
    assert len(report.sealed[0][0]) == 1120 + 32  # ML-KEM-768 ciphertext + X25519 share, then the sealed key
    for party in (0, 1):
        share = open_share(report, party, servers[party].private("mlkem768-x25519"), config.fingerprint, "mlkem768-x25519")
        config.key_dcf().key_from_bytes(split_share(share, config.key_dcf().key_size, config.extras_bytes // 8)[0], party=party)
    with pytest.raises(ReportError, match="capsule must be 64 bytes"):
        open_share(report, 0, servers[0].private("x25519"), config.fingerprint, "x25519")
    again = ServerKeys(tmp_path / "s0")  # the keys persist across restarts
    assert again.public_hex("mlkem768-x25519") == pubs[0]


def test_a_data_directory_whose_x25519_key_is_another_kind_is_refused(tmp_path):
    """hpke_x25519.pem holding a key of another kind (here Ed25519, 32 bytes as well) is refused when the
    server loads its keys: it would otherwise publish that key's bytes as its X25519 key at GET /hpke, and
    no share sealed to them would open (mypy: the PEM loader's type is any private key)."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from dpcdf.errors import ParameterError
    from dpcdf.service.hpke import ServerKeys

    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption())
    (tmp_path / "hpke_x25519.pem").write_bytes(pem)
    with pytest.raises(ParameterError, match="not an X25519 private key"):
        ServerKeys(tmp_path)


def test_another_rfc_9180_implementation_opens_our_shares():
    """pycryptodome's HPKE (DHKEM X25519, HKDF-SHA256, AES-128-GCM, base mode) opens a capsule we seal,
    and its AES-GCM opens each share under the capsule's key with the nonce and associated data
    `wire` names: format 2 is standard parts, nothing of our own."""
    from Crypto.Cipher import AES

    config, keys = _config()
    reports = make_reports(config, [0.5, 0.7])
    pem = keys[0].private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    theirs = ECC.import_key(pem)
    capsule = reports[0].sealed[0][0]
    assert reports[1].sealed[0][0] == capsule  # one capsule per server for the call
    ctx = HPKE.new(receiver_key=theirs, aead_id=HPKE.AEAD.AES128_GCM, enc=capsule[:32], info=capsule_info(config.fingerprint, 0))
    key = ctx.unseal(capsule[32:], b"")
    for r in reports:
        ct = r.sealed[0][1]
        aes = AES.new(key, AES.MODE_GCM, nonce=r.report_id[:12])
        aes.update(share_aad(config.fingerprint, r.report_id, 0))
        assert aes.decrypt_and_verify(ct[:-16], ct[-16:]) == open_share(r, 0, keys[0], config.fingerprint)


def test_format_1_is_still_read_and_format_2_binds_each_share_to_its_report_and_server():
    """A spool of an earlier release holds format 1 reports: they open as before. Format 2's shared
    capsule opens once per opener; what a client or a server in between could try fails: a share
    moved under another report id (same capsule), a share moved to the other server's place, a
    changed capsule (every share under it is refused), a capsule from another task."""
    config, keys = _config()
    reports = make_reports(config, [0.1, 0.2, 0.3])
    plain = {(r.report_id, p): open_share(r, p, keys[p], config.fingerprint) for r in reports for p in (0, 1)}
    rid = reports[0].report_id
    old = Report.from_bytes(v1_report(config, rid, (plain[rid, 0], plain[rid, 1])).to_bytes())
    assert old.version == 1 and old.to_bytes()[:4] == b"DPR1"
    assert open_share(old, 1, keys[1], config.fingerprint) == plain[rid, 1]
    opens = []
    opener = Opener(keys[0], config.fingerprint, 0)
    real = opener._decrypt
    opener._decrypt = lambda *a, **k: opens.append(1) or real(*a, **k)
    for r in reports:
        assert opener(r.report_id, *r.sealed[0]) == plain[r.report_id, 0]
    assert len(opens) == 1  # one HPKE open for the three reports' capsule
    (a, b, c) = reports
    with pytest.raises(ReportError, match="does not open"):
        opener(b.report_id, *a.sealed[0])  # a's share under b's id
    with pytest.raises(ReportError, match="does not open"):
        Opener(keys[1], config.fingerprint, 1)(a.report_id, a.sealed[1][0], a.sealed[0][1])  # server 0's share at server 1
    bad = bytearray(a.sealed[0][0])
    bad[40] ^= 1
    fresh = Opener(keys[0], config.fingerprint, 0)
    for r in reports:
        with pytest.raises(ReportError, match="does not open"):
            fresh(r.report_id, bytes(bad), r.sealed[0][1])
    other, _ = _config()
    with pytest.raises(ReportError, match="does not open"):
        Opener(keys[0], other.fingerprint, 0)(a.report_id, *a.sealed[0])
    ids = [r.report_id[:12] for r in make_reports(config, np.linspace(0, 1, 300))]
    assert len(set(ids)) == 300


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
        ({"payload": "calibration", "split": 1e-9}, "epsilon too small"),
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
    enc_len, ct_len = (len(x) for x in Report.from_bytes(good[0]).sealed[0])  # (the capsule's length)
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
            parsed = (r.version == 2 and r.fingerprint == config.fingerprint
                      and all(len(e) == enc_len and len(c) == ct_len for e, c in r.sealed))
        except ReportError:
            parsed = False
        assert fit == parsed, raw.hex()
        if fit:
            for party in (0, 1):
                assert layout.sealed(raw, party) == (r.report_id, *r.sealed[party])
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

    from dpcdf.service import wire
    from helpers import served_task

    app, client, config = served_task(tmp_path, _config()[0].hpke_keys[1], GRID)
    good = [r.to_bytes() for r in make_reports(config, [0.5] * 8)]
    bad = [g[:36] + secrets.token_bytes(16) + g[52:] for g in good[:2]]  # another id: the share does not open
    failures, opens, real = app.state.failures, [], wire.Opener.__call__

    def opener(self, rid, capsule, ct, version=2):
        opens.append(rid)
        if len(opens) == 2:  # another request of this address used up its allowance meanwhile
            failures.charge("testclient", failures.allowance("testclient"))
        return real(self, rid, capsule, ct, version)

    monkeypatch.setattr(wire.Opener, "__call__", opener)
    res = client.post(f"/tasks/{config.task_id}/reports/batch", content=encode_batch(bad + good))
    assert res.status_code == 429, res.text
    assert len(opens) == 2  # the second refusal's read found nothing left: no good report opened


def test_a_server_takes_both_formats_in_one_batch_and_opens_each_capsule_once(tmp_path, monkeypatch):
    """An upload mixing format 2 reports (two calls: two capsules) and a format 1 report (a spool of
    an earlier release) stores all of them; the server does one HPKE open per capsule and per
    format 1 share, and a format 2 report whose capsule does not open is refused with the reason."""
    from helpers import served_task

    other, keys = _config()
    app, client, config = served_task(tmp_path, other.hpke_keys[1], GRID)
    first, second = make_reports(config, [0.1, 0.2, 0.3]), make_reports(config, [0.4, 0.5])
    from dpcdf.service.hpke import ServerKeys

    donor, mine = make_reports(config, [0.6])[0], ServerKeys(tmp_path).private("x25519")
    old = v1_report(config, donor.report_id, (open_share(donor, 0, mine, config.fingerprint),
                                              open_share(donor, 1, keys[1], config.fingerprint)))
    broken = Report(config.fingerprint, second[0].report_id,  # its capsule's encapsulated key replaced
                    ((bytes(32) + second[0].sealed[0][0][32:], second[0].sealed[0][1]), second[0].sealed[1]))
    opens, real = [], hpke.suite

    def counting(kem):
        suite = real(kem)

        class Counted:
            encrypt = suite.encrypt

            @staticmethod
            def decrypt(*a, **k):
                opens.append(1)
                return suite.decrypt(*a, **k)
        return Counted

    monkeypatch.setattr(hpke, "suite", counting)
    body = encode_batch([r.to_bytes() for r in first + second[1:] + [old, broken]])
    res = client.post(f"/tasks/{config.task_id}/reports/batch", content=body)
    assert res.status_code == 200, res.text
    out = res.json()
    assert out["accepted"] == 5 and [r["index"] for r in out["rejected"]] == [5]
    assert "does not open" in out["rejected"][0]["error"]
    assert len(opens) == 4  # two good capsules, the format 1 share, the broken capsule


def test_an_opener_keeps_a_bounded_number_of_capsule_keys():
    """Security review of format 2: reports under distinct capsules, resent as duplicates (never
    charged), must not grow a request's memory with one AES-GCM context per capsule (162 MB at
    65,536); past CAPSULES the oldest key is forgotten, and a capsule seen again is opened again."""
    import os

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    sk = x25519.X25519PrivateKey.generate()
    fp, n = os.urandom(32), Opener.CAPSULES + 36
    opener = Opener(sk, fp, 0)
    sealed = []
    for _ in range(n):
        key, rid = os.urandom(16), os.urandom(16)
        capsule = hpke.suite("x25519").encrypt(key, sk.public_key(), info=capsule_info(fp, 0))
        sealed.append((rid, capsule, AESGCM(key).encrypt(rid[:12], bytes(20), share_aad(fp, rid, 0))))
    for rid, capsule, ct in sealed + sealed[:1]:
        assert opener(rid, capsule, ct) == bytes(20)
    assert len(opener._keys) == Opener.CAPSULES
