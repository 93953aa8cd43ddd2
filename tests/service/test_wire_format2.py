"""Independent review of report wire format 2 (commit 2ca5070): properties checked to hold.

The capsule is bound to its task and server and cannot stand in for a format 1 seal (or the other
way round); each call draws a fresh capsule per server and distinct nonces; a batch's fast path
(`wire.Layout`) gives exactly the answers of the per-report parser on batches mixing both formats
and their near misses; a capsule that does not open is opened once but charged per report; the
reports of one call sent over several requests (a resumed spool) are stored once each."""
import secrets

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from dpcdf.service import hpke, wire
from dpcdf.service.client import data_holder, make_reports
from dpcdf.service.server.errors import HttpError
from dpcdf.service.server.limits import Failures, Limits
from dpcdf.service.server import ingest
from dpcdf.service.task import TaskConfig
from dpcdf.service.wire import (HEAD, ID_BYTES, NONCE_BYTES, Opener, Report, ReportError, capsule_info, hpke_info,
                                open_share)
from helpers import v1_report

GRID = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 8}


def _keys():
    keys = [x25519.X25519PrivateKey.generate() for _ in range(2)]
    pubs = tuple(k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex() for k in keys)
    return keys, pubs


@pytest.fixture()
def served(tmp_path):
    """A server 0 with one unverified task whose server-1 key we hold: (app, config, server-1 key)."""
    from helpers import served_task

    keys, pubs = _keys()
    app, client, config = served_task(tmp_path, pubs[1], GRID)
    return app, client, config, keys[1]


def test_each_call_has_fresh_capsules_one_per_server_and_distinct_nonces(monkeypatch):
    keys, pubs = _keys()
    config = TaskConfig(GRID, 1.0, "path", "substitution", 1, ("a", "b"), pubs, "00")
    a, b = make_reports(config, [0.1] * 50), make_reports(config, [0.1] * 50)
    for calls in (a, b):
        for party in (0, 1):
            assert len({r.sealed[party][0] for r in calls}) == 1
        assert calls[0].sealed[0][0] != calls[0].sealed[1][0]
        assert len({r.report_id[:NONCE_BYTES] for r in calls}) == 50
    assert {r.sealed[p][0] for r in a for p in (0, 1)}.isdisjoint({r.sealed[p][0] for r in b for p in (0, 1)})
    # report_ids draws again when two nonces collide (ids that differ only after the nonce bytes)
    draws = [bytes(12) + b"\x00\x00\x00\x01" + bytes(12) + b"\x00\x00\x00\x02", secrets.token_bytes(32)]
    monkeypatch.setattr(data_holder.secrets, "token_bytes", lambda n: draws.pop(0))
    ids = data_holder.report_ids(2)
    assert not draws and ids[:NONCE_BYTES] != ids[ID_BYTES : ID_BYTES + NONCE_BYTES]


def test_format_1_and_format_2_seals_do_not_stand_in_for_each_other():
    """Domain separation: a 16-byte key HPKE-sealed under format 1's info (as a format 1 share of
    that report id would be) is no capsule; the magic swapped either way is refused on length; a
    capsule of server 0 does not open at server 1 even with server 1's info (sealed to the other key)."""
    keys, pubs = _keys()
    config = TaskConfig(GRID, 1.0, "path", "substitution", 1, ("a", "b"), pubs, "00")
    r = make_reports(config, [0.4])[0]
    plain = open_share(r, 0, keys[0], config.fingerprint)
    key = secrets.token_bytes(16)
    pk0 = hpke.public_key("x25519", pubs[0])
    fake = hpke.suite("x25519").encrypt(key, pk0, info=hpke_info(config.fingerprint, r.report_id, 0))
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    ct = AESGCM(key).encrypt(r.report_id[:NONCE_BYTES], plain, wire.share_aad(config.fingerprint, r.report_id, 0))
    with pytest.raises(ReportError, match="does not open"):
        Opener(keys[0], config.fingerprint, 0)(r.report_id, fake, ct)
    real = hpke.suite("x25519").encrypt(key, pk0, info=capsule_info(config.fingerprint, 0))
    assert Opener(keys[0], config.fingerprint, 0)(r.report_id, real, ct) == plain  # the control
    swapped = Report.from_bytes(b"DPR1" + r.to_bytes()[4:])
    assert swapped.version == 1
    with pytest.raises(ReportError, match="must be 32 bytes"):
        open_share(swapped, 0, keys[0], config.fingerprint)
    old = v1_report(config, r.report_id, (plain, plain))
    with pytest.raises(ReportError, match="capsule must be 64 bytes"):
        open_share(Report.from_bytes(b"DPR2" + old.to_bytes()[4:]), 0, keys[0], config.fingerprint)
    with pytest.raises(ReportError, match="does not open"):
        Opener(keys[1], config.fingerprint, 1)(r.report_id, r.sealed[0][0], r.sealed[1][1])


def _outcome(srv, st, raws, fast: bool, monkeypatch):
    if not fast:
        monkeypatch.setattr(ingest.Layout, "matches", lambda self, rs: [False] * len(rs))
    try:
        good, rejected = ingest.accept(srv, st, raws, "addr", Failures(Limits()))
        return "ok", [(rid, share) for rid, share in good], [(r.index, r.error) for r in rejected]
    except HttpError as exc:
        return "http", exc.status, str(exc)
    finally:
        monkeypatch.undo()


def test_the_fast_path_answers_as_the_parser_on_mixed_formats_and_near_misses(served, monkeypatch):
    app, _, config, k1 = served
    srv = app.state.server
    st = srv.task(config.task_id)
    r2 = make_reports(config, [0.1, 0.2, 0.3, 0.35])
    donor = make_reports(config, [0.6])[0]
    mine = srv.keys.private("x25519")
    v1 = v1_report(config, donor.report_id, (open_share(donor, 0, mine, config.fingerprint),
                                       open_share(donor, 1, k1, config.fingerprint))).to_bytes()
    good = [r.to_bytes() for r in r2]
    g = good[0]
    share = (len(g) - HEAD) // 2
    near = [
        b"DPR1" + g[4:],  # format 1 magic, format 2 lengths
        b"DPR2" + v1[4:],  # format 2 magic, format 1 lengths
        g[:HEAD] + g[HEAD : HEAD + share] + b"\x00\x00" + b"\x00\x00\x00\x00",  # the other server's share empty
        g + b"\x00",  # a trailing byte
        g[:-1],  # one byte short
        g[:40] + bytes([g[40] ^ 1]) + g[41:],  # the report id changed
        g[:10] + bytes([g[10] ^ 1]) + g[11:],  # the fingerprint changed
        g[:HEAD + share + 2] + bytes([g[HEAD + share + 2] ^ 1]) + g[HEAD + share + 3 :],  # server 1's capsule changed
        g[:HEAD + 2] + bytes([g[HEAD + 2] ^ 1]) + g[HEAD + 3 :],  # server 0's capsule changed
        g[:-1] + bytes([g[-1] ^ 1]),  # server 1's ciphertext changed (server 0 does not see it)
        good[1][: HEAD - ID_BYTES] + good[2][HEAD - ID_BYTES : HEAD] + good[1][HEAD:],  # 2's id on 1's shares
    ]
    raws = good + [v1] + near + good[:1]  # and a report twice
    fast = _outcome(srv, st, raws, True, monkeypatch)
    slow = _outcome(srv, st, raws, False, monkeypatch)
    assert fast == slow
    assert fast[0] == "ok"
    assert {i for i, _ in fast[2]} == {5, 6, 8, 9, 10, 11, 13, 15}
    many = _outcome(srv, st, near * 2, True, monkeypatch)  # 16 refusals: taken; then one more: 400
    assert many == _outcome(srv, st, near * 2, False, monkeypatch) and many[0] == "ok"
    many = _outcome(srv, st, near * 2 + near[:1], True, monkeypatch)
    assert many == _outcome(srv, st, near * 2 + near[:1], False, monkeypatch) and many[:2] == ("http", 400)
    for k in range(len(raws)):  # and each report alone
        assert _outcome(srv, st, [raws[k]], True, monkeypatch) == _outcome(srv, st, [raws[k]], False, monkeypatch)


def test_a_capsule_that_does_not_open_is_opened_once_and_charged_per_report(served, monkeypatch):
    app, client, config, _ = served
    reports = make_reports(config, [0.5] * 20)
    bad = []
    for r in reports:  # every report keeps a copy of the same broken capsule
        cap = bytearray(r.sealed[0][0])
        cap[40] ^= 1
        bad.append(Report(config.fingerprint, r.report_id, ((bytes(cap), r.sealed[0][1]), r.sealed[1])).to_bytes())
    opens, real = [], Opener._open_capsule
    monkeypatch.setattr(Opener, "_open_capsule", lambda self, c: opens.append(c) or real(self, c))
    res = client.post(f"/tasks/{config.task_id}/reports/batch", content=wire.encode_batch(bad))
    assert res.status_code == 400, res.text
    assert len(opens) == 1
    assert app.state.failures.level("testclient") >= ingest.REJECTS_PER_BATCH + 1 - 0.5


def test_a_calls_reports_sent_over_several_requests_are_stored_once(served):
    """A resumed spool sends one call's reports in other batches (and again): each request opens the
    capsule itself; the second sending is all duplicates."""
    _, client, config, _ = served
    raws = [r.to_bytes() for r in make_reports(config, [0.1, 0.2, 0.3, 0.4, 0.5])]
    url = f"/tasks/{config.task_id}/reports/batch"
    first = client.post(url, content=wire.encode_batch(raws[:2])).json()
    assert (first["accepted"], first["duplicates"], first["rejected"]) == (2, 0, [])
    again = client.post(url, content=wire.encode_batch(raws[3:] + raws[:4])).json()
    assert (again["accepted"], again["duplicates"], again["rejected"]) == (3, 3, [])
    one = client.post(f"/tasks/{config.task_id}/reports", content=raws[2])
    assert one.status_code == 409  # a duplicate alone
