"""POST /tasks/{id}/query, for the analyst: this server's shares of noisy prefix counts, tree nodes,
(factorization tasks) coordinates, (adaptive tasks) bins, or (calibration tasks) group sums, from the
reconciled report set."""
from __future__ import annotations

import json
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Body

from ....errors import ParameterError
from ....release.adaptive import RoundTwo
from ....release.calibration import group_scales
from ..deps import THROTTLED, AnalystTaskDep, ServerDep
from ..errors import HttpError
from ..models import KINDS, BinsQuery, CoordinatesQuery, GroupsQuery, NodesQuery, PrefixQuery, Query, QueryResponse, errors
from ..state import TaskState

router = APIRouter(prefix="/tasks/{task_id}", tags=["queries"])


@router.post("/query", response_model=QueryResponse, responses={**errors(400, 401, 403, 404, 409), **THROTTLED})
def query(task_id: str, srv: ServerDep, st: AnalystTaskDep, q: Annotated[Query, Body()]) -> QueryResponse:
    """Answers once the server is reconciled (`close`). Group boundaries are fixed by the first
    groups query, an adaptive task's round two by its first round-two bins or node query (another set
    or design would spend the budget again). A task's queries and its close run one
    at a time (each uses every core); other tasks' do not wait for them. Limit: an analyst token has
    at most 2 closes and queries in flight on a server at once (DPCDF_ANALYST_CONCURRENCY); one more
    is answered 429 {"error": ...} with a Retry-After header (seconds), and can be sent again then."""
    check(st, q)
    config, fixes = st.config, []
    if isinstance(q, GroupsQuery):
        fixes.append(("groups", json.dumps(q.edges),
                      "this task's groups are already released with other boundaries: the budget is spent"))
    if config.mechanism == "adaptive" and (isinstance(q, NodesQuery) or q.round == 2):
        fixes.append(("round-two", json.dumps("tree" if isinstance(q, NodesQuery) else q.ends),
                      "this task's round two is already released with another design (other bins, or its tree): "
                      "the budget is spent"))
    with srv.analyst_slot(st), st.answering:
        shards, n, digest = st.open_for_query(fixes)
        agg = st.aggregator
        if isinstance(q, GroupsQuery):
            shares = agg.group_shares(shards, np.array(q.edges, np.int64), group_scales(config.epsilon, config.split))
        elif isinstance(q, PrefixQuery):
            shares = agg.prefix_shares(shards, np.array(q.indices, np.int64))
        elif isinstance(q, CoordinatesQuery):
            shares = agg.coordinate_shares(shards)
        elif isinstance(q, BinsQuery):
            shares = agg.bin_shares(shards, q.round, None if q.ends is None else np.array(q.ends, np.int64))
        else:
            shares = agg.node_shares(shards, q.level)
        if config.payload == "calibration" and not isinstance(q, GroupsQuery):
            shares = shares[:, 0]  # only the ECDF of the probabilities: the other elements go out as group sums
        st.log_query(q.kind, int(shares.size))
    width = 1 if shares.ndim == 1 else shares.shape[1]
    return QueryResponse(party=srv.party, n=n if config.n_public else None, reports_hash=digest, width=width,
                         shares=[str(int(v)) for v in shares.reshape(-1)], modulus=str(st.dcf.modulus))


def check(st: TaskState, q: PrefixQuery | NodesQuery | GroupsQuery | CoordinatesQuery | BinsQuery) -> None:
    """What the model cannot check without the task: indices on its grid, a released tree level,
    groups on calibration tasks only, coordinates on factorization tasks only (which answer nothing
    else: their noise is on R x, not on prefixes or nodes), bins on adaptive tasks only (which answer
    those and their round-two tree's nodes: no prefixes), round two's bins a partition of the grid."""
    mech = st.aggregator.mechanism
    size = mech.size
    adaptive = st.config.mechanism == "adaptive"
    if isinstance(q, BinsQuery) != adaptive and not (adaptive and isinstance(q, NodesQuery)):
        raise HttpError(400, "an adaptive task answers 'bins' and its round-two tree's 'nodes' only, and only it "
                             "answers 'bins'")
    if isinstance(q, BinsQuery):
        if (q.round == 2) != (q.ends is not None):
            raise HttpError(400, "round 1's bins are the task's (no ends); round 2 names its bins' ends")
        if q.ends is not None:
            try:
                mech.check_plan(RoundTwo("bins", tuple(q.ends)))
            except ParameterError as exc:
                raise HttpError(400, str(exc)) from None
        return
    if isinstance(q, CoordinatesQuery) != (not mech.answers_prefixes and not adaptive):
        raise HttpError(400, "a factorization task answers 'coordinates' queries only, and only it does")
    if isinstance(q, CoordinatesQuery):
        return
    if isinstance(q, GroupsQuery):
        if st.config.payload != "calibration":
            raise HttpError(400, KINDS)
        if not all(0 <= e < size - 1 for e in q.edges):
            raise HttpError(400, f"edges must be non-decreasing grid indices in [0, {size - 1})")
    elif isinstance(q, PrefixQuery):
        if not all(0 <= i < size for i in q.indices):
            raise HttpError(400, f"indices must be a non-empty list of grid indices in [0, {size})")
    elif st.config.mechanism not in ("tree", "adaptive") or q.level not in st.aggregator.mechanism.released_levels():
        raise HttpError(400, "node queries need the tree mechanism and a released level")
