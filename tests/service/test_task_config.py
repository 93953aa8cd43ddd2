"""A task config pins how its release is made: a server (or an analyst) that loads a config later
must derive the same mechanism, or an answer given before an upgrade and one given after would be two
releases of one budget. Here: the add/remove tree's root share (issue 14), round one's fine bins (issue 25)
and a verified task's F_p key format (issue 22)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dpcdf import ParameterError
from dpcdf.release.mechanisms import ROOT_SHARE, TreeMechanism
from dpcdf.service.task import TaskConfig

BASE = dict(grid={"kind": "uniform", "lo": 0, "hi": 1, "bits": 10}, epsilon=0.5, mechanism="tree", min_batch=0,
            servers=("http://a", "http://b"), hpke_keys=("00", "01"), token_hash="0" * 64, verify=False, task_id="t1")


def test_a_new_add_remove_tree_task_pins_the_root_share():
    config = TaskConfig(relation="add-remove", **BASE)
    assert config.root_share == ROOT_SHARE and json.loads(config.to_json())["root_share"] == ROOT_SHARE
    mech = config.make_mechanism()
    assert mech.budgets[-1] == pytest.approx(0.5 * ROOT_SHARE) and mech.shape.height in mech.noised_levels()
    assert TaskConfig.from_json(config.to_json()) == config


def test_a_config_written_before_the_root_share_keeps_its_plan_and_fingerprint():
    """Without the field: the plan it was answered with (the root noised only in a full tree), the
    same JSON and fingerprint; the mechanism equals TreeMechanism(root_share=0)."""
    old_json = TaskConfig(relation="add-remove", **BASE).to_json().replace(f',"root_share":{ROOT_SHARE}', "")
    assert "root_share" not in old_json
    old = TaskConfig.from_json(old_json)
    assert old.root_share == 0 and old.to_json() == old_json
    mech = old.make_mechanism()
    assert mech.budgets == TreeMechanism(1024, 0.5, "add-remove", root_share=0).budgets
    assert mech.budgets != TaskConfig(relation="add-remove", **BASE).make_mechanism().budgets


@pytest.mark.parametrize("change", [{"relation": "substitution"}, {"relation": "add-remove", "payload": "label"},
                                    {"relation": "add-remove", "mechanism": "path"}])
def test_the_share_applies_to_add_remove_tree_count_tasks_only(change):
    config = TaskConfig(**(BASE | change))
    assert config.root_share == 0 and "root_share" not in config.to_json()
    assert TaskConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("share", [1.0, -0.1, True, "0.2", float("nan")])
def test_a_bad_root_share_is_refused(share):
    with pytest.raises(ParameterError, match="root_share"):
        TaskConfig(relation="add-remove", root_share=share, **BASE)


# --- the F_p key format of a verified task (issue 22) ------------------------------------------------
def test_a_new_verified_task_pins_key_format_2_and_an_old_one_keeps_1():
    """New verified tasks make and parse keys of format 2 (an element a rejection-sampled word); a
    config written before the field keeps format 1, its JSON and fingerprint, so that reports stored by
    an earlier release still parse; an unverified task has ring keys, one format, and no field."""
    new = TaskConfig(relation="substitution", **{**BASE, "verify": True})
    assert new.key_format == 2 and json.loads(new.to_json())["key_format"] == 2
    assert new.key_dcf().params.version == new.dcf().params.version == 2
    assert TaskConfig.from_json(new.to_json()) == new
    old_json = new.to_json().replace(',"key_format":2', "")
    assert "key_format" not in old_json
    old = TaskConfig.from_json(old_json)
    assert old.key_format == 1 and old.to_json() == old_json and old.fingerprint != new.fingerprint
    assert old.key_dcf().params.version == 1 and old.key_dcf().params.describe().endswith("version=1)")
    plain = TaskConfig(relation="substitution", **BASE)
    assert plain.key_format == 1 and "key_format" not in plain.to_json() and not plain.dcf().params.prime


@pytest.mark.parametrize("fmt", [0, 3, True, "2", 2.5, 2.0, 1.0])
def test_a_bad_key_format_is_refused(fmt):
    with pytest.raises(ParameterError, match="key_format"):
        TaskConfig(relation="substitution", key_format=fmt, **{**BASE, "verify": True})


def test_a_server_parses_only_its_task_s_key_format():
    """A report whose keys have the other format is a malformed report (KeyFormatError, a 400 on the
    servers), never evaluated with the wrong element derivation."""
    from fss import KeyFormatError

    new = TaskConfig(relation="substitution", **{**BASE, "verify": True})
    old = TaskConfig.from_json(new.to_json().replace(',"key_format":2', ""))
    for made, parsed in ((new, old), (old, new)):
        key = made.key_dcf().gen(3, [1] * made.check().key_width)[0].to_bytes()
        with pytest.raises(KeyFormatError, match="key format version"):
            parsed.key_dcf().key_from_bytes(key)
        assert made.key_dcf().key_from_bytes(key).to_bytes() == key


# --- two distinct servers (issue 20) ---------------------------------------------------------------
@pytest.mark.parametrize("servers", [("http://a", "http://a"), ("http://A:80/", "http://a"), ("https://a", "HTTPS://a:443//"),
                                     ("http://127.0.0.1:8000", "http://127.0.0.1:8000/")])
def test_a_config_whose_two_servers_share_a_url_is_refused(servers):
    from dpcdf.service.task import SameServerError

    with pytest.raises(SameServerError, match="two servers are one server"):
        TaskConfig(relation="substitution", **{**BASE, "servers": servers})
    assert issubclass(SameServerError, ParameterError)


def test_a_config_whose_two_servers_share_a_key_is_refused():
    """The same key (in any case) under two URLs: whoever holds it opens both shares; also when the
    config arrives as JSON (a server registering it, a client loading it)."""
    from dpcdf.service.task import SameServerError

    key = "ab" * 32
    with pytest.raises(SameServerError, match="same HPKE key"):
        TaskConfig(relation="substitution", **{**BASE, "hpke_keys": (key, key.upper())})
    d = json.loads(TaskConfig(relation="substitution", **BASE).to_json())
    d["hpke_keys"] = [key, key]
    with pytest.raises(SameServerError):
        TaskConfig.from_json(json.dumps(d))
    assert TaskConfig(relation="substitution", **{**BASE, "servers": ("http://a:80", "http://a:81")}).servers[1] == "http://a:81"


def test_the_client_refuses_one_server_before_it_seals_anything(monkeypatch):
    """A config made to name one server twice after its checks (a bug, or a hand-edited object)
    never gets a report: make_reports checks before any key is made or sealed, and create_task
    checks the URLs before any request."""
    from dpcdf.service.client import data_holder as client
    from dpcdf.service.task import SameServerError

    config = TaskConfig(relation="substitution", **BASE)
    object.__setattr__(config, "servers", ("http://a", "http://a/"))
    sealed = []
    monkeypatch.setattr(client.hpke, "suite", lambda *a: sealed.append(a))  # would record any sealing
    with pytest.raises(SameServerError, match="one server"):
        client.make_reports(config, [0.5])
    object.__setattr__(config, "servers", ("http://a", "http://b"))
    object.__setattr__(config, "hpke_keys", ("00", "00"))
    with pytest.raises(SameServerError, match="same HPKE key"):
        client.make_reports(config, [0.5])
    assert sealed == []
    with pytest.raises(SameServerError):  # port 9 on loopback: a request would fail as ServerError instead
        client.create_task(["http://127.0.0.1:9", "http://127.0.0.1:9/"], BASE["grid"], 1.0, "tree", "substitution", 0,
                           admin_tokens="x" * 20)


def test_an_adaptive_task_pins_its_plan_rules_and_an_older_config_keeps_version_1():
    """A server fixes round two's design the first time it is asked, so an analyst must plan from round
    one with the rules the task was made with: a new adaptive task pins `adaptive_plan` 9 (round one a level of the
    tree, the plan by estimated error), one written with version 8 (the route, its screen) keeps it; one written with version 5 (at least `MIN_FLAT_BINS` flat bins under
    substitution) keeps it, and so does a config written with version 4 (graded
    bins, 1 or 2 flat bins), one with version 3 (a spike's run of bins also counted whole: split groups) keeps it
    (its mechanism plans by version 3); a config written with version 2 (mass round one cannot
    place cut at the fine bins, spikes into 4-point bins) keeps it, with no groups, and its servers refuse
    a plan with groups; a config with fine bins written before version 2 (no field) plans by version 1,
    with the same JSON and fingerprint (the review of issue 25 found 37 of 200 such tasks' plans refused
    with 403 after the change)."""
    nine = TaskConfig(**(BASE | {"mechanism": "adaptive", "relation": "add-remove", "min_batch": 0}))
    assert nine.adaptive_plan == 9 and json.loads(nine.to_json())["adaptive_plan"] == 9 and not nine.make_mechanism().routed
    config = TaskConfig.from_json(nine.to_json().replace('"adaptive_plan":9,', '"adaptive_plan":8,'))
    assert config.make_mechanism().plan_version == 8 and config.make_mechanism().routed and config.fingerprint != nine.fingerprint
    seven = TaskConfig.from_json(config.to_json().replace('"adaptive_plan":8,', '"adaptive_plan":7,'))
    assert seven.make_mechanism().plan_version == 7 and seven.fingerprint != config.fingerprint
    config = seven  # the older versions below are written over version 7's JSON
    six = TaskConfig.from_json(config.to_json().replace('"adaptive_plan":7,', '"adaptive_plan":6,'))
    assert six.make_mechanism().plan_version == 6 and six.make_mechanism().zero_ends.size == 1 and six.fingerprint != config.fingerprint
    five = TaskConfig.from_json(config.to_json().replace('"adaptive_plan":7,', '"adaptive_plan":5,'))
    assert five.make_mechanism().plan_version == 5 and not five.make_mechanism().routed and five.fingerprint != config.fingerprint
    config = five
    four = TaskConfig.from_json(config.to_json().replace('"adaptive_plan":5,', '"adaptive_plan":4,'))
    assert four.adaptive_plan == 4 and four.make_mechanism().plan_version == 4 and four.fingerprint != config.fingerprint
    three = TaskConfig.from_json(config.to_json().replace('"adaptive_plan":5,', '"adaptive_plan":3,'))
    assert three.adaptive_plan == 3 and three.make_mechanism().plan_version == 3 and three.fingerprint != config.fingerprint
    config = three  # version 3 against the older ones, below
    two = TaskConfig.from_json(config.to_json().replace('"adaptive_plan":3,', '"adaptive_plan":2,'))
    old_json = config.to_json().replace('"adaptive_plan":3,', "")
    old = TaskConfig.from_json(old_json)
    assert old.adaptive_plan == 1 and old.fine_bins and old.to_json() == old_json and old.fingerprint != config.fingerprint
    assert two.adaptive_plan == 2 and two.fingerprint not in (config.fingerprint, old.fingerprint)
    new, second, before = config.make_mechanism(), two.make_mechanism(), old.make_mechanism()
    assert (new.plan_version, second.plan_version, before.plan_version) == (3, 2, 1)
    counts = np.zeros(new.bins_one)
    k = new.fine_ends.size // 32  # fine bins per coarse bin
    counts[5], counts[32 + 5 * k: 32 + 6 * k] = 1000.0, 1000.0 / k  # mass in one coarse bin, no fine bin a spike
    cut = set(new.fine_ends[5 * k: 6 * k].tolist())
    assert cut <= set(new.plan(counts).ends) and not cut <= set(before.plan(counts).ends)
    plan, plan_two = new.plan(counts), second.plan(counts)
    assert plan.ends == plan_two.ends and plan.groups and not plan_two.groups  # that coarse bin: one split group
    assert cut - {max(cut)} <= set(plan.ends) - set(plan.groups)  # inside one split group
    assert new.check_plan(plan) == plan
    with pytest.raises(ParameterError, match="no split groups"):
        second.check_plan(plan)
    for bad in (10, 0, True, "2"):
        with pytest.raises(ParameterError, match="version"):
            TaskConfig(**(BASE | {"mechanism": "adaptive", "relation": "add-remove", "min_batch": 0, "adaptive_plan": bad}))
    tree = TaskConfig(**(BASE | {"relation": "substitution"}))
    assert tree.adaptive_plan == 1 and "adaptive_plan" not in tree.to_json()


def test_an_adaptive_task_pins_round_ones_fine_bins_and_an_older_config_keeps_its_32():
    """Issue 25: a new adaptive task counts round one's fine bins too (`fine_bins` in its JSON); a config
    written before them (no field) keeps the 32 bins it was answered with, the same JSON and fingerprint,
    so a server upgraded mid-task answers round one as before (not a second release of its budget)."""
    config = TaskConfig(**(BASE | {"mechanism": "adaptive", "relation": "substitution"}))
    assert config.fine_bins and json.loads(config.to_json())["fine_bins"] is True
    mech = config.make_mechanism()  # version 9: round one's fine bins are the nodes of a tree level (94 on 2^10)
    assert mech.bins_one == 32 + mech.fine_ends.size == 32 + 94 and TaskConfig.from_json(config.to_json()) == config
    old_json = config.to_json().replace(',"fine_bins":true', "").replace('"adaptive_plan":9,', "").replace('"adaptive_shares":2,', "")
    old = TaskConfig.from_json(old_json)
    assert old.fine_bins is False and old.to_json() == old_json and old.fingerprint != config.fingerprint
    # without fine bins round one has rule 1's shares whatever the field says: one config, one fingerprint
    assert TaskConfig.from_json(old_json.replace("{", '{"adaptive_shares":2,', 1)) == old
    mech = old.make_mechanism()
    assert mech.bins_one == 32 and mech.stated_epsilon() == 0.5 and mech.eps_two == pytest.approx(0.85 * 0.5)
    tree = TaskConfig(**(BASE | {"relation": "substitution"}))
    assert tree.fine_bins is False and "fine_bins" not in tree.to_json()
    with pytest.raises(ParameterError, match="fine_bins"):
        TaskConfig(**(BASE | {"mechanism": "adaptive", "relation": "substitution", "fine_bins": 1}))


def test_a_tasks_name_is_printable_and_left_out_of_the_json_when_absent():
    """Issue 46: `name` labels a task for people; a config without one has the JSON and fingerprint it had."""
    plain = TaskConfig(**BASE, relation="substitution")
    assert "name" not in json.loads(plain.to_json()) and TaskConfig.from_json(plain.to_json()) == plain
    named = TaskConfig(**BASE, relation="substitution", name="ages, ward 4")
    assert json.loads(named.to_json())["name"] == "ages, ward 4" and named.fingerprint != plain.fingerprint
    assert TaskConfig.from_json(named.to_json()) == named
    for bad in ("", "a\nb", "x" * 81, 7, "\x00"):
        with pytest.raises(ParameterError, match="name"):
            TaskConfig(**BASE, relation="substitution", name=bad)
