"""GET /metrics (the operator's bearer token: 401 without, 403 with another): the server's counters in
the Prometheus text format (`server.metrics`). Point Prometheus at it with `authorization: {credentials_file: ...}`."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ..deps import OperatorMetricsDep, ServerDep
from ..metrics import CONTENT_TYPE
from ..models import errors

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response, responses={**errors(401, 403), 200: {"content": {CONTENT_TYPE: {}}}})
def metrics(request: Request, srv: ServerDep, _: OperatorMetricsDep) -> Response:
    state = request.app.state
    return Response(state.metrics.render(srv, state.retention), media_type=CONTENT_TYPE)
