"""The analyst: asks both servers the same question, adds the shares mod 2^64 (mod p = 2^61 - 1 for a
verified task), reads the sums as signed noisy counts, and post-processes them exactly like the
central release. Each server adds its
own full noise, so the answers are epsilon-DP even if the analyst colludes with one server; the
price is twice the noise variance (the consistency step knows it)."""
from __future__ import annotations

import json

import numpy as np

from ...errors import DpcdfError, ParameterError
from ...release.ecdf import Release, finish_release
from ...release.queries import GroupsQuery, PrefixQuery, Query, to_dict
from ..http import ServerError, http
from ..task import MAX_QUERY_POINTS, TaskConfig
from ..files import read_text, read_token, token_path


class TokenRefused(ServerError):
    """A server refused the analyst token: it is not this task's token (HTTP 401)."""


class Analyst:
    def __init__(self, config: TaskConfig, token: str, token_file: str | None = None):
        """`token_file`: where the token came from, named in the message if a server refuses it."""
        self.config, self.token, self.token_file = config, token, token_file
        self.grid = config.make_grid()
        self.mechanism = config.make_mechanism()
        self.dcf = config.dcf()  # its group: how the two servers' shares add up
        self._closed = False
        self.rejected: dict[str, int] | None = None  # per reason class, once a verified task is closed

    @classmethod
    def from_task_file(cls, task_file: str, token_file: str | None = None):
        """The analyst of the task `dpcdf task` wrote to `task_file`, with the token in `token_file`
        (default: TASK.token beside it, as `dpcdf task` writes it); `TaskFileError` (a ParameterError)
        naming the file that is missing, unreadable, empty or not a task config. The task file is
        read before the token, so a wrong task path is named as such.

            analyst = dpcdf.Analyst.from_task_file("task.json")
            release = analyst.release()"""
        read_text(task_file, "task file")
        where = token_path(task_file, token_file)
        token = read_token(where)
        return cls(TaskConfig.from_file(task_file), token, token_file=where)

    def close(self) -> int | None:
        """Closes the collection: server 0 reconciles the report sets with server 1 directly
        (`dpcdf.service.protocols.reconciliation.maths`: any report that reached one server only is dropped, whatever their
        number), then both servers show the keyed hash of their set, which must be equal; for a
        verified task they check every report first and `rejected` holds the excluded reports per
        reason class (else None). Idempotent; the first query calls it. Returns the number of reports
        (None under add/remove)."""
        views = [self._http("POST", f"{u}/tasks/{self.config.task_id}/close", b"") for u in self.config.servers]
        if views[0]["reports_hash"] != views[1]["reports_hash"] or views[0].get("rejected") != views[1].get("rejected"):
            raise ServerError("the servers could not agree on one report set")
        self.rejected = views[0].get("rejected")
        self._closed = True
        return views[1]["n"]

    def _http(self, method: str, url: str, body: bytes | None = None) -> dict:
        """A request with the analyst token; a 401 becomes `TokenRefused`, naming the token's file."""
        try:
            return http(method, url, body, self.token)
        except ServerError as exc:
            if exc.status != 401:
                raise
            where = f" in {self.token_file}" if self.token_file else ""
            raise TokenRefused(f"{url.split('/tasks/')[0]} refused the analyst token{where}: it is not the token of "
                               f"task {self.config.task_id[:12]}... (use the TASK.token file that dpcdf task wrote with "
                               "this task config)", 401) from None

    def status(self, party: int = 0) -> dict:
        """A server's view of the task (server 0's by default): {"reports", "closed", "min_batch"}, and
        "restored" on a server restored from a backup (also checks the token)."""
        if party not in (0, 1):
            raise ParameterError(f"party is 0 or 1, got {party!r}")
        return self._http("GET", f"{self.config.servers[party]}/tasks/{self.config.task_id}")

    def closed_on_servers(self) -> bool:
        """Whether the collection is closed already (on server 0, which closes first)."""
        return bool(self.status()["closed"])

    def ask(self, q: Query) -> tuple[np.ndarray, int]:
        """Both servers' answers to one query, added up: the noisy values (int64, a trailing axis per
        payload element if any) and n (0 under add/remove). Prefix queries go in parts of at most
        MAX_QUERY_POINTS indices (`prefix_counts`)."""
        if isinstance(q, PrefixQuery):
            return self.prefix_counts(q.indices)
        return self._ask(to_dict(q))

    def _ask(self, question: dict) -> tuple[np.ndarray, int]:
        """One question (a query's JSON, `dpcdf.release.queries.to_dict`) to both servers."""
        if not self._closed:
            self.close()
        body = json.dumps(question).encode()
        answers = [self._http("POST", f"{url}/tasks/{self.config.task_id}/query", body) for url in self.config.servers]
        if answers[0]["reports_hash"] != answers[1]["reports_hash"]:
            raise ServerError("the servers answer from different report sets (one of them does not follow the "
                              "protocol); their answers do not add up")
        s0 = np.array([int(v) for v in answers[0]["shares"]], np.uint64)
        s1 = np.array([int(v) for v in answers[1]["shares"]], np.uint64)
        if s0.shape != s1.shape:
            raise ServerError(f"the servers sent {s0.size} and {s1.size} shares for one question (one of them does "
                              "not follow the protocol)")
        moduli = {int(a.get("modulus", 1 << 64)) for a in answers}
        if moduli != {self.dcf.modulus}:  # 2^64, or p = 2^61 - 1 for a verified task
            raise ServerError(f"the servers' shares are not in this task's group (moduli {sorted(moduli)})")
        total = self.dcf.reconstruct(s0, s1, signed=True)  # counts and noise are far below half the modulus
        width = int(answers[0].get("width", 1))
        n = answers[0]["n"]  # None under add/remove: the count is not public, the release estimates it
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ServerError(f"a server sent n = {n!r:.40}, not a count (it does not follow the protocol)")
        return (total if width == 1 else total.reshape(-1, width)), (0 if n is None else int(n))

    def prefix_counts(self, indices) -> tuple[np.ndarray, int]:
        """Noisy counts #{v : index(v) <= i} (int64) at grid indices, and n. A factorization task
        (zCDP) answers its full release only: use `release()`."""
        if not self.mechanism.answers_prefixes:
            raise DpcdfError(f"a {self.mechanism.name} task answers no prefix query (it releases the whole ECDF at "
                             "once): use release(), or dpcdf query without --bisect")
        idx = [int(i) for i in indices]
        parts = [self._ask(to_dict(PrefixQuery(idx[k:k + MAX_QUERY_POINTS])))
                 for k in range(0, max(len(idx), 1), MAX_QUERY_POINTS)]
        return np.concatenate([p[0] for p in parts]), parts[0][1]

    def _total(self, n: int) -> float:
        """n when public (substitution); else the noisy count at the last grid index."""
        if self.config.n_public:
            return float(n)
        last, _ = self.prefix_counts([self.grid.size - 1])
        return float(max(last[0], 1))

    def ecdf(self, ts) -> np.ndarray:
        """The raw DP ECDF at values t (the noisy prefix count at the largest threshold <= t over the
        total), from prefix queries only: no full-grid release needed, so it works on any grid size."""
        t = np.asarray(ts, dtype=np.float64).reshape(-1)
        if t.size == 0:
            return np.zeros(0)
        idx = np.searchsorted(self.grid.thresholds, t, side="right") - 1
        counts, n = self.prefix_counts(np.maximum(idx, 0))
        return np.where(idx >= 0, counts / self._total(n), 0.0)

    def quantile(self, ps) -> np.ndarray:
        """The paper's Algorithm 1 over the grid: per level p, binary search for the smallest threshold
        whose noisy ECDF reaches p; all levels step together (log2(N) rounds of prefix queries). Every
        answer is post-processing of the same fixed node noise, so the search costs no extra budget.
        ParameterError for levels outside [0, 1] (as `Release.quantile`)."""
        p = np.asarray(ps, dtype=np.float64).reshape(-1)
        if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
            raise ParameterError("quantile levels must lie in [0, 1]")
        lo, hi = np.zeros(p.size, np.int64), np.full(p.size, self.grid.size - 1, np.int64)
        total = None
        while (lo < hi).any():
            mid = (lo + hi) // 2
            counts, n = self.prefix_counts(mid)
            total = self._total(n) if total is None else total
            below = counts / total < p
            lo, hi = np.where(below & (lo < hi), mid + 1, lo), np.where(~below & (lo < hi), mid, hi)
        return self.grid.thresholds[lo]

    def releases(self, postprocess_with: str = "auto") -> list[Release]:
        """One full-grid release per payload element, post-processed like the central one
        (`postprocess_with`, as `dpcdf.release_ecdf`'s), knowing that every value carries both
        servers' noise."""
        mech, seen = self.mechanism, {"n": 0}

        def answer(q: Query) -> np.ndarray:
            counts, seen["n"] = self.ask(q)
            return counts

        # the questions the mechanism's release needs (an adaptive one plans round two from round one's answers)
        release = mech.ask(answer, n=lambda: seen["n"], copies=2)
        return [finish_release(self.grid, mech, part, seen["n"], postprocess_with, copies=2) for part in mech.elements(release)]

    def release(self, postprocess_with: str = "auto") -> Release:
        """The full-grid ECDF release, post-processed as `dpcdf.release_ecdf`'s (`postprocess_with`:
        "auto" smooths a tree release on up to 2^12 points, "monotone" is the plain fit); for a
        calibration task, the ECDF of the probabilities."""
        if self.config.payload.roc:
            raise DpcdfError("this task releases a ROC curve: use roc() (dpcdf.Analyst)")
        return self.releases(postprocess_with)[0]

    def group_sums(self, edges) -> np.ndarray:
        """A calibration task's noisy per-group sums (n, labels, probabilities in fixed point), one row
        per group (.., e_1], (e_1, e_2], ...; released once per task: the servers refuse other edges."""
        if not self.config.payload.scored:
            raise DpcdfError("group sums need a calibration task")
        sums, _ = self.ask(GroupsQuery([int(e) for e in edges]))
        return sums
