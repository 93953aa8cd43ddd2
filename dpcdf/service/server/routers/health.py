"""GET /health (is the server up, are its kernels compiled: anyone), GET /health/operator (also: is
round one of verified reports still running; the operator's token, since how long it runs grows with
the number of reports, private under add/remove) and GET /hpke (its public keys)."""
from __future__ import annotations

from fastapi import APIRouter

from ...hpke import KEMS
from ..deps import OperatorHealthDep, ServerDep
from ..models import Health, Hpke, OperatorHealth, errors

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health(srv: ServerDep) -> Health:
    return Health(party=srv.party, warm=srv.warm.is_set())


@router.get("/health/operator", response_model=OperatorHealth, responses=errors(401, 403))
def operator_health(srv: ServerDep, _: OperatorHealthDep) -> OperatorHealth:
    """/health and whether round one of verified tasks' reports has work queued or running (the
    operator's bearer token)."""
    return OperatorHealth(party=srv.party, warm=srv.warm.is_set(), checking=srv.checker.backlog())


@router.get("/hpke", response_model=Hpke)
def hpke(srv: ServerDep) -> Hpke:
    """The keys clients seal this server's key shares to, and a task config must name."""
    return Hpke(keys={kem: srv.keys.public_hex(kem) for kem in KEMS})
