"""Writes mechanism_noise_v2.json: the noise the path and tree mechanisms release under a fixed
PRF key, pinned so that refactoring the mechanisms or the servers' aggregation cannot change a
released value.

For every case: the prefix noise at chosen grid indices (path: the sum over the leaf's path nodes;
tree: the sum over the covering nodes of the released levels), the noise of the first 64 released
tree nodes of each level, and what a server (`Aggregator`, fixed seed and task id, no reports) adds to its
prefix and node shares (node shares: the first 64 of each level and a SHA-256 of all). The file was produced by the code *before* the mechanisms got a common
interface (issue 10), so `tests/release/test_mechanism_vectors.py` checks the new code against the
old one. Regenerate only on a deliberate change of the noise derivation (bump the version). v2: the
add/remove tree plan gives the root a fixed share of epsilon (`mechanisms.ROOT_SHARE`, issue 14), which
changes the add/remove tree cases' scales; the path and substitution cases are v1's, value for value.

    python tests/vectors/generate_mechanism_noise.py
"""
from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from pathlib import Path

import numpy as np

from dpcdf.release.mechanisms import PathMechanism, TreeMechanism
from dpcdf.release.noise import prf_noise

OUT = Path(__file__).with_name("mechanism_noise_v2.json")
KEY = hashlib.sha256(b"fss-dpcdf mechanism noise vector key").digest()[:16]
SEED = hashlib.sha256(b"fss-dpcdf mechanism noise vector seed").digest()
TASK_ID = "vectors-v1"

CASES = [  # (mechanism, size, epsilon, relation, branching)
    ("path", 1 << 16, 1.0, "substitution", None),
    ("path", 1000, 0.5, "add-remove", None),
    ("tree", 1 << 16, 1.0, "substitution", None),
    ("tree", 1000, 0.5, "add-remove", None),
    ("tree", 1024, 0.5, "add-remove", 2),  # a full tree: the root is noised
    ("tree", 100, 7.77, "substitution", 3),
]


def noise_fn(ids: np.ndarray, scale: Fraction) -> np.ndarray:
    return prf_noise(KEY, ids, scale)


def indices_for(size: int) -> np.ndarray:
    rng = np.random.default_rng(size)
    picked = rng.choice(size, min(size, 200), replace=False)
    return np.unique(np.concatenate([[0, 1, size // 2, size - 2, size - 1], picked])).astype(np.int64)


def make(kind: str, size: int, eps: float, relation: str, branching):
    if kind == "path":
        return PathMechanism(size, eps, relation)
    return TreeMechanism(size, eps, relation, branching=branching)


def old_prefix_noise(mech, idx: np.ndarray) -> np.ndarray:
    """As the code before issue 10 computed it (dpcdf/service/server/aggregate.py's per-index loop)."""
    if isinstance(mech, PathMechanism):
        return mech.prefix_noise(idx, noise_fn)
    return np.array([sum(int(mech.node_noise(lv, np.array([j]), noise_fn)[0]) for lv, j in mech.shape.covering(int(i)))
                     for i in idx], np.int64)


def digest(values: np.ndarray) -> str:
    """SHA-256 of the values as little-endian int64: pins a whole level without storing it."""
    return hashlib.sha256(np.asarray(values, "<i8").tobytes()).hexdigest()


def server_noise(mech, idx: np.ndarray) -> tuple[list[int], dict[str, list[int]]]:
    """What an Aggregator without reports returns: its own noise only (int64)."""
    from fss import DCF
    from dpcdf.service.server.aggregate import Aggregator

    agg = Aggregator(DCF(max(1, int(np.ceil(np.log2(mech.size)))), 64, 1, cmp="ge"), mech, SEED, TASK_ID)
    prefix = agg.prefix_shares([], idx).view(np.int64)
    nodes = {}
    if isinstance(mech, TreeMechanism):
        for level in mech.released_levels():
            full = agg.node_shares([], level).view(np.int64)
            nodes[str(level)] = {"first": [int(v) for v in full[:64]], "sha256": digest(full)}
    return [int(v) for v in prefix], nodes


def main() -> None:
    cases = []
    for kind, size, eps, relation, branching in CASES:
        mech = make(kind, size, eps, relation, branching)
        idx = indices_for(size)
        case = {"mechanism": kind, "size": size, "epsilon": eps, "relation": relation, "branching": mech.shape.branching,
                "indices": [int(i) for i in idx], "prefix_noise": [int(v) for v in old_prefix_noise(mech, idx)]}
        if kind == "tree":
            case["node_noise"] = {}
            for level in mech.released_levels():
                count = mech.node_bounds(level)[0].size
                case["node_noise"][str(level)] = [int(v) for v in mech.node_noise(level, np.arange(min(count, 64)), noise_fn)]
        case["server_prefix_noise"], case["server_node_noise"] = server_noise(mech, idx)
        cases.append(case)
    doc = {"about": "prefix and node noise of the path and tree mechanisms under prf_noise with a fixed key "
                    "(see generate_mechanism_noise.py)", "key": KEY.hex(), "seed": SEED.hex(), "task_id": TASK_ID,
           "cases": cases}
    OUT.write_text(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
