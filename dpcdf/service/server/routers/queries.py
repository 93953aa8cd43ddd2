"""POST /tasks/{id}/query, for the analyst: this server's shares of noisy prefix counts, tree nodes,
(factorization tasks) coordinates, (adaptive tasks) bins, or (calibration tasks) group sums, from the
reconciled report set. The router parses the JSON into its plain query (`models.QueryModel.to_query`);
what each query type is checked against and answered with is `answers`' (one handler per type)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from .. import answers
from ..deps import THROTTLED, AnalystTaskDep, ServerDep
from ..models import Query, QueryResponse, errors

router = APIRouter(prefix="/tasks/{task_id}", tags=["queries"])


@router.post("/query", response_model=QueryResponse, responses={**errors(400, 401, 403, 404, 409), **THROTTLED})
def query(task_id: str, srv: ServerDep, st: AnalystTaskDep, q: Annotated[Query, Body()]) -> QueryResponse:
    """Answers once the server is reconciled (`close`). Group boundaries are fixed by the first
    groups query, an adaptive task's round two by its first round-two bins or node query (another set
    or design would spend the budget again). A task's queries and its close run one
    at a time (each uses every core); other tasks' do not wait for them. Limit: an analyst token has
    at most 2 closes and queries in flight on a server at once (DPCDF_ANALYST_CONCURRENCY); one more
    is answered 429 {"error": ...} with a Retry-After header (seconds), and can be sent again then."""
    config = st.config
    plain = q.to_query()
    answers.check(plain, config, st.aggregator)  # QueryRefused: 400
    with srv.analyst_slot(st), st.answering:
        source, n, digest = st.open_for_query(answers.designs(plain, config))
        shares = answers.shares(plain, config, st.aggregator, source)
        st.log_query(plain.kind, int(shares.size))
    width = 1 if shares.ndim == 1 else shares.shape[1]
    return QueryResponse(party=srv.party, n=n if config.n_public else None, reports_hash=digest, width=width,
                         shares=[str(int(v)) for v in shares.reshape(-1)], modulus=str(st.dcf.modulus))
