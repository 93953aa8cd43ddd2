"""The payload of a task (`dpcdf.release.payload.Payload`, issue 43): a str enum whose members are the
strings stored in task JSON, with the facts the call sites branch on as properties."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dpcdf import ParameterError
from dpcdf.release.payload import Payload


def test_a_payload_is_its_string_in_json_messages_and_comparisons():
    for p in Payload:
        assert p == p.value and hash(p) == hash(p.value) and Payload(p.value) is p and Payload.parse(p.value) is p
        assert json.dumps({"payload": p}) == json.dumps({"payload": p.value})
        assert str(p) == f"{p}" == p.value and f"a {p} task" == f"a {p.value} task"
    assert [p.value for p in Payload] == ["count", "label", "calibration"]


@pytest.mark.parametrize("bad", ["Count", "labels", "", None, 1, ["count"]])
def test_an_unknown_payload_is_a_parameter_error_with_the_old_message(bad):
    assert Payload.get(bad) is None
    with pytest.raises(ParameterError, match=r"payload must be 'count' \(an ECDF\), 'label' \(a ROC curve\) or "
                                             r"'calibration' \(Hosmer-Lemeshow\), got "):
        Payload.parse(bad)


def test_the_facts_of_each_payload():
    table = {p: (p.width, p.labelled, p.plain, p.roc, p.scored, p.verifiable) for p in Payload}
    assert table == {Payload.COUNT: (1, False, True, False, False, True),
                     Payload.LABEL: (2, True, False, True, False, True),
                     Payload.CALIBRATION: (3, True, False, False, True, True)}


def test_encode_makes_each_payloads_key_vectors_and_refuses_what_does_not_fit():
    v = np.array([0.0, 0.25, 1.0])
    assert Payload.COUNT.betas(v) == 1
    assert Payload.LABEL.betas(v, [1, 0, 1]).tolist() == [[1, 0], [0, 1], [1, 0]]
    assert Payload.CALIBRATION.betas(v, [1, 0, 1]).tolist() == [[1, 1, 0], [1, 0, 1 << 14], [1, 1, 1 << 16]]
    with pytest.raises(ParameterError, match="labels belong to label tasks"):
        Payload.COUNT.betas(v, [1, 0, 1])
    for p in (Payload.LABEL, Payload.CALIBRATION):
        for labels in (None, [1, 0], [1, 0, 2]):
            with pytest.raises(ParameterError, match=f"a {p.value} task needs one label"):
                p.betas(v, labels)
    with pytest.raises(ParameterError, match="probabilities in"):
        Payload.CALIBRATION.betas(v + 0.5, [1, 0, 1])


def test_a_payload_is_a_string_everywhere_a_string_is_taken():
    """Review of issue 43: the member equals its string, so str's own methods must still be str's
    (an `encode` of the payload vectors shadowed str.encode and broke `urllib.parse.quote`)."""
    from urllib.parse import quote

    for p in Payload:
        assert p.encode() == p.value.encode() and quote(p) == p.value and f"{p}" == p.value

