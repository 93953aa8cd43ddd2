"""Round two's design does not drift within a plan version: tests/vectors/adaptive_plans_v1.json pins
the plan of every version for fixed round-one answers (eight data shapes, three epsilons, both
relations; written by `tests/vectors/generate_adaptive_plans.py`, its versions 1 to 3 checked against
the code before version 4, and 1 to 4 against the file before version 5; version 9 from its own round one, a
level of the tree). A server fixes a task's design the first time it is asked and the analyst
plans with the rules the task pinned, so a silent change here would make them disagree (403)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpcdf.release.adaptive import AdaptiveMechanism

SHARE_RULE = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2, 9: 2}  # as `tests/vectors/generate_adaptive_plans.py` planned each version

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "adaptive_plans_v1.json").read_text())
CASES = VECTORS["cases"]


def test_the_vectors_cover_every_version_shape_and_design():
    assert {v for c in CASES for v in c["plans"]} == {"1", "2", "3", "4", "5", "6", "7", "8", "9"}
    nine = {(p["plans"]["9"]["design"], p["plans"]["9"]["fill"], bool(p["plans"]["9"]["groups"])) for p in CASES}
    assert {("tree", "linear", False), ("bins", "pchip", False), ("bins", "linear", False), ("bins", "pchip", True)} <= nine
    assert len({c["shape"] for c in CASES}) == 8 and {c["relation"] for c in CASES} == {"substitution", "add-remove"}
    designs = {(v, p["design"], p["fill"], bool(p["groups"])) for c in CASES for v, p in c["plans"].items()}
    assert {("4", "bins", "pchip", True), ("4", "bins", "linear", False), ("4", "bins", "pchip", False),
            ("3", "tree", "linear", False), ("4", "tree", "linear", False)} <= designs
    assert any(c["plans"]["4"] != c["plans"]["3"] for c in CASES) and any(c["plans"]["2"] != c["plans"]["1"] for c in CASES)
    exact = [c for c in CASES if c["round_one_is"] == "exact"]  # narrow spikes only the unplaced test sees (`heavy_ends`)
    assert any(c["plans"]["4"]["design"] == "bins" and c["plans"]["4"] != c["plans"]["3"] for c in exact)
    assert any(c["relation"] == "add-remove" and c["plans"]["4"]["design"] == c["plans"]["3"]["design"] == "tree" for c in exact)
    assert all(c["plans"]["7"] == c["plans"]["6"] for c in CASES)  # version 7 changes round zero (the route), not the plan
    assert all(c["plans"]["8"] == c["plans"]["7"] for c in CASES if c["relation"] == "add-remove")  # version 8 plans
    assert any(c["plans"]["8"] != c["plans"]["7"] for c in CASES)  # substitution's rounds at 98% of epsilon (round zero)
    five = [c for c in CASES if c["plans"]["5"] != c["plans"]["4"]]  # version 5: flat data's 1 or 2 bins, under substitution
    assert five and all(c["relation"] == "substitution" and c["plans"]["4"]["fill"] == "linear"
                        and len(c["plans"]["4"]["ends"]) < 3 <= len(c["plans"]["5"]["ends"]) for c in five)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['shape']}-{c['round_one_is']}-{c['relation']}-{c['epsilon']}")
def test_every_versions_plan_is_what_it_was(case):
    for version, want in case["plans"].items():
        one = np.array(case["round_one_9" if version == "9" else "round_one"], np.float64)  # version 9: a level of the tree
        plan = AdaptiveMechanism(case["size"], case["epsilon"], case["relation"], plan_version=int(version),
                                 share_rule=SHARE_RULE[int(version)]).plan(one, case["n"])
        got = {"design": plan.design, "ends": list(plan.ends), "fill": plan.fill, "groups": list(plan.groups)}
        assert got == want, f"version {version}"
