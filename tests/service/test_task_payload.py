"""A task's payload is a `Payload` (issue 43) and its config's JSON and fingerprint are what they were
when it was a string: the vectors below were made by the release before the type (20b58c8)."""
from __future__ import annotations

import pytest

from dpcdf import ParameterError
from dpcdf.release.payload import Payload
from dpcdf.service.task import TaskConfig
from dpcdf.service.verification.maths import Check

BASE = dict(grid={"kind": "uniform", "lo": 0, "hi": 1, "bits": 10}, epsilon=0.5, min_batch=0,
            servers=("http://a", "http://b"), hpke_keys=("00", "01"), token_hash="0" * 64, task_id="t1")
VECTORS = [  # (payload, fields, the fingerprint before the Payload type)
    ("count", dict(mechanism="tree", relation="add-remove"), "20ee0370beeb7ceae3bdf41fa0c5dc60951cd73dac61f0270658eacf8135bb41"),
    ("label", dict(mechanism="tree", relation="substitution"), "3b0ac34d82912d8b4a83c8b5c058b9ffd2764cc2a990bb29a26abf7d8f09a284"),
    ("calibration", dict(mechanism="tree", relation="substitution", split=0.3),
     "0545111b4fb8a529635c485aff65d95938db98560727a56d0c8c3ed70e391208"),
    ("count", dict(mechanism="path", relation="substitution", verify=False),
     "3e95b6adc6aef1e8442148554e13ebdd1751ff0914ccc534685e1c7538c16ac5"),
]


@pytest.mark.parametrize("payload, fields, fingerprint", VECTORS)
def test_a_configs_json_and_fingerprint_are_those_of_the_string_payload(payload, fields, fingerprint):
    for given in (payload, Payload(payload)):
        config = TaskConfig(payload=given, **BASE, **fields)
        assert config.payload is Payload(payload) and config.fingerprint.hex() == fingerprint
        assert f'"payload":"{payload}"' in config.to_json()
        back = TaskConfig.from_json(config.to_json())
        assert back == config and back.payload is Payload(payload) and back.to_json() == config.to_json()
        assert config.width == Payload(payload).width == Check(given, 4).width


def test_an_unknown_payload_is_refused_as_before():
    with pytest.raises(ParameterError, match=r"payload must be 'count' \(an ECDF\), 'label' \(a ROC curve\) or "
                                             r"'calibration' \(Hosmer-Lemeshow\), got 'roc'"):
        TaskConfig(payload="roc", mechanism="tree", relation="substitution", **BASE)
    with pytest.raises(ParameterError, match=r"reports of payload 'roc' cannot be verified \(verified payloads: "
                                             r"\('count', 'label', 'calibration'\)\)"):
        Check("roc", 4)


def test_every_list_of_payload_names_is_payloads():
    """Review of issue 43: the names also listed where importing `Payload` would load the release (the
    warm-up and the CLI's parser, which must start without the optional packages) or fix an OpenAPI
    schema (the task model's Literal) are exactly Payload's, in its order."""
    import typing

    from dpcdf import warmup
    from dpcdf.cli import build_parser
    from dpcdf.service.server.models import TaskSpec

    names = tuple(p.value for p in Payload)
    assert warmup.PAYLOADS == names
    assert typing.get_args(TaskSpec.model_fields["payload"].annotation) == names
    task = next(a for a in build_parser()._subparsers._group_actions[0].choices["task"]._actions if a.dest == "payload")
    assert tuple(task.choices) == names
