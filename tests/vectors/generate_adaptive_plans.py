"""Writes adaptive_plans_v1.json: round two's design (`AdaptiveMechanism.plan`) for fixed round-one
answers, under every plan version. A server fixes a task's round-two design the first time it is
asked, and the analyst plans it from round one with the rules the task pinned (`TaskConfig.adaptive_plan`),
so a change of the rules of an existing version would make the analyst's plan differ from the one a
server fixed (403) or change what a task releases: `tests/release/test_adaptive_plan_vectors.py`
replans every case and compares. Round one's answers are a central release's (`AdaptiveMechanism.noisy`)
under a fixed PRF key (and, for narrow spikes on 2^10, the exact counts too), on eight data shapes, at eps 0.1, 0.5 and 1, under both relations. When this
file was written (plan version 4), the version 1 to 3 plans were also computed by the code before
version 4 (commit 31b8915) and were identical; when version 5 was added, the version 1 to 4 plans
were those of the file before it, and so were versions 1 to 5 when version 6 was added, 1 to 6 when 7 was, 1 to 7 when 8 was,
and 1 to 8 when 9 was. Version 9's round one is a level of the tree (`adaptive_level`), other answers than the
earlier versions': each case carries them as `round_one_9` (the same key's noise, or the exact counts).
Regenerate only to add a version.

    python tests/vectors/generate_adaptive_plans.py
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from dpcdf import Grid, prefix_counts
from dpcdf.release import adaptive_level
from dpcdf.release.adaptive import AdaptiveMechanism
from dpcdf.release.noise import prf_noise

OUT = Path(__file__).with_name("adaptive_plans_v1.json")
KEY = hashlib.sha256(b"fss-dpcdf adaptive plan vector key").digest()[:16]
VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)  # planned from version 5's round one; 9 from its own (`LEVEL_VERSIONS`)
LEVEL_VERSIONS = (9,)
SHARE_RULE = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2, 9: 2}  # the shares' rule each version is planned with (round one: rule 2's)


def shapes() -> dict[str, tuple[np.ndarray, int]]:
    """Values and grid size per shape (the data only: numpy's generator, fixed seeds)."""
    rng = np.random.default_rng(2026)

    def spikes(centres, n, sd, size):
        centres = np.asarray(centres, np.float64)
        return np.clip(np.rint(rng.normal(centres[rng.integers(0, centres.size, n)], sd)), 0, size - 1).astype(np.int64)

    return {
        "paper": (np.repeat(np.arange(1024), rng.poisson(3, 1024)), 1024),
        "skewed": (np.minimum(rng.exponential(25, 3000).astype(np.int64), 1023), 1024),
        "normal": (np.clip(np.rint(rng.normal(512, 60, 3000)), 0, 1023).astype(np.int64), 1024),
        "lognormal": (np.minimum(rng.lognormal(4, 1, 3000).astype(np.int64), 1023), 1024),
        "five spikes": (spikes([300, 310, 1800, 2600, 3900], 5000, 2, 4096), 4096),
        "narrow spikes": (spikes(rng.uniform(50, 970, 5), 3000, 2, 1024), 1024),
        "sixty spikes": (np.concatenate([spikes(rng.uniform(0, 2048, 60), 4000, 3, 4096),
                                         rng.integers(25 * 128, 26 * 128, 400)]), 4096),
        "heavy spikes": (spikes([300, 1800, 2600, 3900], 1_000_000, 2, 4096), 4096),  # the tree (`TREE_SDS`)
    }


def cases() -> list[dict]:
    out = []
    for name, (values, size) in shapes().items():
        prefix = prefix_counts(values, Grid.integers(size))
        for relation in ("substitution", "add-remove"):
            for epsilon in (0.1, 0.5, 1.0):
                noise = lambda ids, scale: prf_noise(KEY, ids, scale)  # noqa: E731
                mech = AdaptiveMechanism(size, epsilon, relation, plan_version=5, share_rule=2)
                ones = {"noisy": mech.noisy(prefix, noise).round_one}
                if name == "narrow spikes":  # round one's exact counts: where only the test for unplaced mass sees them
                    ones["exact"] = np.concatenate([np.diff(np.append(0, prefix[e])) for e in mech.round_one_parts])
                n = int(prefix[-1]) if relation == "substitution" else None
                for kind, one in ones.items():
                    plans = {}
                    for version in VERSIONS:
                        plan = AdaptiveMechanism(size, epsilon, relation, plan_version=version,
                                                 share_rule=SHARE_RULE[version]).plan(one, n)
                        plans[str(version)] = {"design": plan.design, "ends": list(plan.ends), "fill": plan.fill,
                                               "groups": list(plan.groups)}
                    level = AdaptiveMechanism(size, epsilon, relation, plan_version=9)
                    one_9 = level.noisy(prefix, noise).round_one if kind == "noisy" else adaptive_level.with_coarse(
                        np.diff(np.append(0, prefix[level.fine_ends])), level.fine_ends, level.round_one_ends)
                    for version in LEVEL_VERSIONS:
                        plan = AdaptiveMechanism(size, epsilon, relation, plan_version=version).plan(one_9, n)
                        plans[str(version)] = {"design": plan.design, "ends": list(plan.ends), "fill": plan.fill,
                                               "groups": list(plan.groups)}
                    out.append({"shape": name, "round_one_is": kind, "size": size, "relation": relation, "epsilon": epsilon,
                                "n": n, "round_one": [int(c) for c in one], "round_one_9": [int(c) for c in one_9],
                                "plans": plans})
    return out


if __name__ == "__main__":
    OUT.write_text(json.dumps({"key": KEY.hex(), "cases": cases()}, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")
