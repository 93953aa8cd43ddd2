"""What a server computes for the analyst, free of HTTP: shares of prefix and node counts from its
key shares, plus its own full tree noise derived from its secret seed.

Evaluation is a map over key shards and a sum (`partial_sums`), so a server can spread it over a
distributed engine later without touching the protocol.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from fss import DCF, KeyBatch

from .mechanisms import PathMechanism, TreeMechanism
from .noise import prf_key, prf_noise


def partial_sums(dcf: DCF, shards: list[KeyBatch], points: np.ndarray) -> np.ndarray:
    """sum over shards of dcf.eval_sum(shard, points), mod 2^64 (uint64 (m,))."""
    total = np.zeros(points.size, np.uint64)
    for shard in shards:
        if len(shard):
            total += dcf.eval_sum(shard, points)
    return total


class Aggregator:
    """One server's view of one task: the mechanism, its DCF, and its noise (PRF of its seed)."""

    def __init__(self, dcf: DCF, mechanism: PathMechanism | TreeMechanism, seed: bytes, task_id: str, noise: bool = True):
        self.dcf, self.mechanism = dcf, mechanism
        self.key = prf_key(seed, f"{task_id}/{mechanism.name}")
        self.noise_on = noise

    def noise(self, ids: np.ndarray, scale: Fraction) -> np.ndarray:
        if not self.noise_on:
            return np.zeros(np.asarray(ids).size, np.int64)
        return prf_noise(self.key, ids, scale)

    def prefix_shares(self, shards: list[KeyBatch], indices: np.ndarray) -> np.ndarray:
        """Share of (count(index <= i) + this server's noise on the nodes S(i)) for each index i."""
        idx = np.asarray(indices, np.int64)
        shares = partial_sums(self.dcf, shards, idx)
        if isinstance(self.mechanism, PathMechanism):
            eta = self.mechanism.prefix_noise(idx, self.noise)
        else:
            eta = np.array([sum(int(self.mechanism.node_noise(lv, np.array([j]), self.noise)[0])
                                for lv, j in self.mechanism.shape.covering(int(i))) for i in idx], np.int64)
        return shares + eta.astype(np.int64).view(np.uint64)

    def node_shares(self, shards: list[KeyBatch], level: int) -> np.ndarray:
        """Share of (count + this server's noise) for every data-holding node of a tree level."""
        mech = self.mechanism
        if not isinstance(mech, TreeMechanism):
            raise TypeError("node counts belong to the tree mechanism")
        starts, ends = mech.node_bounds(level)
        points = np.unique(np.concatenate([ends, starts[starts > 0] - 1]))
        sums = dict(zip(points.tolist(), partial_sums(self.dcf, shards, points)))
        hi = np.array([sums[int(e)] for e in ends], np.uint64)
        lo = np.array([sums[int(s) - 1] if s > 0 else 0 for s in starts], np.uint64)
        eta = mech.node_noise(level, np.arange(starts.size), self.noise)
        return hi - lo + eta.astype(np.int64).view(np.uint64)
