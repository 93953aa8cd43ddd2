"""GET /health (is the server up, are its kernels compiled, is round one of verified reports still
running) and GET /hpke (its public keys)."""
from __future__ import annotations

from fastapi import APIRouter

from ...hpke import KEMS
from ..deps import ServerDep
from ..models import Health, Hpke

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health(srv: ServerDep) -> Health:
    return Health(party=srv.party, warm=srv.warm.is_set(), checking=srv.checker.backlog())


@router.get("/hpke", response_model=Hpke)
def hpke(srv: ServerDep) -> Hpke:
    """The keys clients seal this server's key shares to, and a task config must name."""
    return Hpke(keys={kem: srv.keys.public_hex(kem) for kem in KEMS})
