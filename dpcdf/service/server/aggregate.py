"""What a server computes for the analyst, free of HTTP: shares of prefix and node counts (or a
factorization's coordinates) from its key shares, plus its own full noise derived from its secret
seed (discrete Laplace, or the discrete Gaussian for a zCDP task).

Evaluation is a map over key shards and a sum (`partial_sums`), done in-process or by an
`Evaluator` such as `dask_eval.DaskEvaluator` (a Dask cluster); either way the sum comes back here
and the noise is added here, so a server's noise seed never leaves it.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Callable

import numpy as np

from fss import DCF, KeyBatch
from fss import field as F

from ...errors import ParameterError
from ...release.adaptive import AdaptiveMechanism, RoundTwo
from ...release.factorization import right_factor_times
from ...release.mechanisms import Mechanism
from ...release.noise import prf_key, prf_noise
from ...release.zcdp import GaussianVariance, prf_dgauss


def partial_sums(dcf: DCF, shards: list[KeyBatch], points: np.ndarray) -> np.ndarray:
    """sum over shards of dcf.eval_sum(shard, points), mod 2^64: uint64 (m,), or (m, width)."""
    total = np.zeros((points.size,) + ((dcf.width,) if dcf.width > 1 else ()), np.uint64)
    for shard in shards:
        if len(shard):
            total += dcf.eval_sum(shard, points)
    return total & np.uint64(dcf.params.mask)


class Histogram:
    """A task's histogram share: this server's share of the number of (passing) reports with index
    <= i, for every grid index i (width elements each): a verified task's in F_p, an unverified one's
    mod 2^64, each made once at the close (`histograms`). A query reads it in O(points), whatever the
    number of reports."""

    def __init__(self, values: np.ndarray, set_hash: str):
        self.values, self.set_hash = np.asarray(values, np.uint64), set_hash

    def at(self, points: np.ndarray) -> np.ndarray:
        out = self.values[np.asarray(points, np.int64)]
        return out[:, 0] if out.shape[1] == 1 else out


Evaluator = Callable[[DCF, list, np.ndarray], np.ndarray]
"""What `partial_sums` computes, computed elsewhere: (dcf, shards, points) -> the same uint64 array."""


class Aggregator:
    """One server's view of one task: the mechanism, its DCF, and its noise (PRF of its seed)."""

    def __init__(self, dcf: DCF, mechanism: Mechanism, seed: bytes, task_id: str, noise: bool = True,
                 evaluator: Evaluator | None = None):
        self.dcf, self.mechanism = dcf, mechanism
        self.evaluator = evaluator  # None: in-process (`partial_sums`)
        label = f"{task_id}/{mechanism.name}"
        # one noise stream per payload element: each element is its own released ECDF
        self.keys = [prf_key(seed, label if dcf.width == 1 else f"{label}/{e}") for e in range(dcf.width)]
        self.group_key = prf_key(seed, f"{task_id}/groups")  # the once-only group sums (calibration tasks)
        self.noise_on = noise
        self.prime = dcf.params.prime  # a verified task's shares are in F_p, p = 2^61 - 1

    def sums(self, shards: "list[KeyBatch] | Histogram", points: np.ndarray) -> np.ndarray:
        """The noiseless sums over all shards at `points`: in-process, or by the evaluator; for a
        verified task, read from its histogram share (`Histogram`)."""
        points = np.asarray(points, np.int64)
        if isinstance(shards, Histogram):
            return shards.at(points)
        if self.evaluator is None or not any(len(s) for s in shards):
            return partial_sums(self.dcf, shards, points)
        return self.evaluator(self.dcf, shards, points)

    def grid_histogram(self, shards: list[KeyBatch], size: int, set_hash: str) -> Histogram:
        """An unverified task's histogram share (issue 44): its keys' summed shares at every grid index
        (`sums`, in-process or on the evaluator: one pass over the keys), kept so that every later query
        reads O(points), as a verified task's does. The same bits as `sums` at any points; a function of
        this server's key shares alone, so what a query releases is unchanged. A server with a Dask
        evaluator makes it this way at the close (`histograms`); one evaluating in-process sums the same
        bits in batches while the reports arrive (`protocols.grid_sums`), and tests hold the two equal."""
        values = self.sums(shards, np.arange(size, dtype=np.int64))
        return Histogram(np.asarray(values, np.uint64).reshape(size, -1), set_hash)

    def noise_fn(self, element: int):
        def noise(ids: np.ndarray, scale: Fraction) -> np.ndarray:
            if not self.noise_on:
                return np.zeros(np.asarray(ids).size, np.int64)
            if isinstance(scale, GaussianVariance):  # a zCDP task: the exact discrete Gaussian
                return prf_dgauss(self.keys[element], ids, scale)
            return prf_noise(self.keys[element], ids, scale)

        return noise

    def _plus(self, shares: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """shares + integer noise in the DCF's group (mod 2^64, or mod p for a verified task)."""
        noise = np.asarray(noise, np.int64)
        if self.prime:
            mag = F.reduce64(np.abs(noise).astype(np.uint64))  # |noise| < 2^62, far below p / 2
            return F.add(shares, np.where(noise < 0, F.neg(mag), mag))
        return shares + noise.view(np.uint64)

    def _minus(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return F.sub(a, b) if self.prime else a - b

    def _add(self, shares: np.ndarray, noise_of) -> np.ndarray:
        """shares + each element's noise (int64 noise, added in the DCF's group)."""
        if self.dcf.width == 1:
            return self._plus(shares, noise_of(self.noise_fn(0)))
        out = shares.copy()
        for e in range(self.dcf.width):
            out[:, e] = self._plus(out[:, e], noise_of(self.noise_fn(e)))
        return out

    def prefix_shares(self, shards: list[KeyBatch], indices: np.ndarray) -> np.ndarray:
        """Share of (count(index <= i) + this server's noise on the nodes S(i)) for each index i
        (`Mechanism.prefix_noise`: the path's nodes, or the tree's covering nodes, batched)."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        return self._add(self.sums(shards, idx), lambda fn: self.mechanism.prefix_noise(idx, fn))

    def node_shares(self, shards: list[KeyBatch], level: int, whole: bool = False) -> np.ndarray:
        """Share of (count + this server's noise) for every data-holding node of a tree level (`whole`:
        of an adaptive mechanism's whole tree, plan versions 6 to 8). ParameterError unless the mechanism
        releases that level's node counts (`released_levels`: none for the path mechanism; never an
        exact root that is not public)."""
        mech = getattr(self.mechanism, "whole", None) if whole else self.mechanism
        if mech is None:
            raise ParameterError("this task's mechanism has no whole tree (adaptive, plan versions 6 to 8, only)")
        if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or int(level) not in mech.released_levels():
            raise ParameterError(f"the {mech.name} mechanism releases node counts of levels {mech.released_levels()} "
                                 f"only, not {level!r}")
        level = int(level)
        starts, ends = mech.node_bounds(level)
        points = np.unique(np.concatenate([ends, starts[starts > 0] - 1]))
        sums = self.sums(shards, points)
        hi = sums[np.searchsorted(points, ends)]
        lo = np.zeros_like(hi)
        has_lo = starts > 0
        lo[has_lo] = sums[np.searchsorted(points, starts[has_lo] - 1)]
        return self._add(self._minus(hi, lo), lambda fn: mech.node_noise(level, np.arange(starts.size), fn))

    def coordinate_shares(self, shards: list[KeyBatch]) -> np.ndarray:
        """A factorization task's release share: R x + this server's N_Z(0, sigma^2) per coordinate
        (x: its share of the histogram, R the mechanism's integer right factor, exact in the DCF's
        group), then under substitution its share of n itself (public there). ParameterError for any
        other mechanism."""
        mech = self.mechanism
        if self.dcf.width != 1:
            raise ParameterError("coordinates are released for count tasks only")
        noise = mech.coordinate_noise(self.noise_fn(0))  # ParameterError unless a factorization
        prefix = self.sums(shards, np.arange(mech.size))
        x = self._minus(prefix, np.concatenate([np.zeros(1, np.uint64), prefix[:-1]]))
        shares = self._plus(right_factor_times(x, self.dcf.modulus), noise)
        return np.concatenate([shares, prefix[-1:]]) if mech.relation == "substitution" else shares

    def bin_shares(self, shards: list[KeyBatch], round_: int, ends: np.ndarray | None = None, groups=()) -> np.ndarray:
        """An adaptive task's bin counts: round 1 its fixed equal-width bins (coarse, then fine), round 2 the bins ending at
        `ends` (checked by `AdaptiveMechanism.check_plan`; then its split `groups`' totals and the whole grid's count,
        `round_two_parts`), plus this server's noise at each value's scale (`AdaptiveMechanism.bin_noise`: ids no tree node uses;
        plan version 9's round one is the nodes of a tree level, with their own noise). ParameterError for any other
        mechanism or a bad partition. Whether round two may be answered is the router's (once per task)."""
        mech = self.mechanism
        if not isinstance(mech, AdaptiveMechanism) or self.dcf.width != 1:
            raise ParameterError("bins are released by adaptive count tasks only")
        plan = None
        parts: list[tuple[np.ndarray, np.ndarray | slice]]
        if round_ == 0:  # plan version 6: the count of the whole grid (`adaptive_route`; exact under substitution to
            parts = [(mech.zero_ends, slice(None))]  # version 7), from 7 under add/remove, 8 under both the fine bins' counts
        elif round_ == 1:  # its partitions one after another (coarse, then fine: `AdaptiveMechanism.round_one_parts`)
            parts = [(e, slice(None)) for e in mech.round_one_parts]
        else:
            if ends is None:
                raise ParameterError("round two names its bins' ends")
            plan = mech.check_plan(RoundTwo("bins", tuple(ends), groups=tuple(groups)))
            parts = mech.round_two_parts(plan)
        counts = np.concatenate([self._interval_shares(shards, e)[s, 0] for e, s in parts])
        return self._plus(counts, mech.bin_noise(round_, counts.size, self.noise_fn(0), plan))

    def _interval_shares(self, shards: list[KeyBatch], ends: np.ndarray) -> np.ndarray:
        """(len(ends), width) noiseless shares of the counts in (.., e_0], (e_0, e_1], ...: the prefix
        sums at the ends, each less the one before."""
        sums = self.sums(shards, ends).reshape(len(ends), -1)
        return self._minus(sums, np.concatenate([np.zeros((1, sums.shape[1]), np.uint64), sums[:-1]]))

    def group_shares(self, shards: list[KeyBatch], edges: np.ndarray, scales: list) -> np.ndarray:
        """Shares of every payload element summed over the index groups (.., e_1], (e_1, e_2], ...,
        (e_last, size-1], plus this server's noise: one scale per element (`calibration.group_scales`:
        DLap scales, or under zCDP `GaussianVariance`s, for which the noise is the exact N_Z(0, sigma^2),
        `prf_dgauss`), each element its own PRF domain of the task's group key."""
        points = np.concatenate([np.asarray(edges, np.int64), [self.mechanism.size - 1]])
        groups = self._interval_shares(shards, points)
        ids = np.arange(points.size, dtype=np.uint64)
        for e, scale in enumerate(scales):
            domain = ids + np.uint64((e + 1) << 32)
            if not self.noise_on:
                eta = np.zeros(ids.size, np.int64)
            elif isinstance(scale, GaussianVariance):  # a zCDP task: the exact discrete Gaussian
                eta = prf_dgauss(self.group_key, domain, scale)
            else:
                eta = prf_noise(self.group_key, domain, scale)
            groups[:, e] = self._plus(groups[:, e], eta)
        return groups
