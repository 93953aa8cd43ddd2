"""Server to server over HTTP: server 0's messages to server 1 during a close (`poster`), each with
its request tag (`protocols.channel.request_header`), and server 1's answers to them (`answer`), the
protocols' refusals as HTTP statuses. The protocols themselves are the task's Leader/Helper objects
(`TaskState.close_as_leader`, `answer_sync`, `answer_check`). Server 1 checks the tag from the headers
before it reads the body (`peer_gate`, called by `limits.Guard`); `answer` then checks that the body is
the one the tag covers, and charges whatever does not open to the sender's address."""
from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING, Callable

from fastapi import Request

from ..http import ServerError, fetch, http
from ..protocols.channel import PEER_HEADER, NotReady, Refused, Unopened
from ..protocols.reconciliation.maths import SyncError
from .errors import HttpError, PeerFailed, TaskNotFound
from .limits import client_address
from .peer_gate import BAD_TAG, PeerRequest

if TYPE_CHECKING:
    from ..task import TaskConfig
    from .state import Server, TaskState

OCTETS = "application/octet-stream"
PEER_TIMEOUT = 60  # seconds per socket operation with server 1 (its part for 10^6 reports: a few seconds)
CHECK_WAIT = 1800  # seconds server 0 waits for server 1's evaluation of its reports (10^6 at 2^10: about a minute)
BUSY_WAIT = 60  # seconds server 0 sends a message again while server 1's pool of peer messages is full (429)
CHECK_RETRY = (0.02, 1.0)  # seconds between sends while server 1 is still evaluating (503): from the first, doubling to the
# second (a flat second held every verified close that found server 1 a tenth of a second from ready: a calibration
# task's close at 20,000 reports took 1.4 s, 1.0 of it this wait, bench/bench_calibration.py)
FORGED = "the message is not the other server's for this task"
PROBE_TIMEOUT = 10  # seconds for server 0's probe of server 1 at a registration


def probe(config: "TaskConfig") -> None:
    """Server 0, at a task's registration (issue 46): reaches server 1 as its close will (the URL, TLS
    with this server's CAs: `http.use_ca_file`) and checks that it answers with the HPKE key the task
    names for it, so that a wrong URL, a certificate this server does not trust or a swapped key
    refuses the task now (502, or 400 for the key), before any client uploads, not at the close."""
    url = config.servers[1]
    try:
        keys = http("GET", f"{url}/hpke", timeout=PROBE_TIMEOUT).get("keys", {})
    except ServerError as exc:
        raise HttpError(502, f"server 0 cannot reach server 1 at {url} ({exc}): the task is not registered; fix the URL, "
                             "or the certificates server 0 trusts (dpcdf serve --ca-file), and register again") from None
    if keys.get(config.kem) != config.hpke_keys[1]:
        raise HttpError(400, f"server 1 at {url} answers with another {config.kem} HPKE key than the task names for it: "
                             "the task is not registered")


def poster(st: "TaskState") -> Callable[[str, bytes], bytes]:
    """`post(path, message)`: one message to server 1's POST /tasks/{id}/<path> and its answer."""
    base = f"{st.config.servers[1]}/tasks/{st.config.task_id}"
    return lambda path, message: _post(f"{base}/{path}", message, {PEER_HEADER: st.channel.request_header(path, message)},
                                       patient=path == "verify")


def _post(url: str, message: bytes, headers: dict[str, str], patient: bool = False) -> bytes:
    """One message to server 1 and its answer; PeerFailed (502) if it does not come (PEER_TIMEOUT per socket
    operation, so a peer that accepts but never answers holds the close for a minute, not forever),
    `Refused` if server 1 refuses it (409). `patient`: a 503 (server 1 still evaluating its reports
    for the check) is sent again after 20 ms, then each time twice as long up to a second
    (`CHECK_RETRY`), for up to CHECK_WAIT seconds. A 429 (server 1 has its
    peers' pool full: other tasks' closes), or a connection broken before any answer (a large message
    server 1 refused with 429 from its headers and closed while it was being sent: review of issue 42),
    is sent again each second for up to BUSY_WAIT seconds from the last other answer (every step is
    answered once, from the journal: sending one again is safe)."""
    first = other = time.monotonic()  # the first attempt (CHECK_WAIT), the last answer that was not "busy" (BUSY_WAIT)
    pause = CHECK_RETRY[0]
    while True:
        try:
            return fetch("POST", url, message, content_type=OCTETS, timeout=PEER_TIMEOUT, headers=headers)
        except ServerError as exc:
            now = time.monotonic()
            if patient and exc.status == 503 and now - first < CHECK_WAIT:
                other = now
                time.sleep(pause)
                pause = min(CHECK_RETRY[1], 2 * pause)
                continue
            busy = exc.status == 429 or (exc.status is None and any(s in str(exc) for s in ("Broken pipe", "reset by peer")))
            if busy and now - other < BUSY_WAIT:
                time.sleep(1)
                continue
            if exc.status == 409:
                raise Refused(f"server 1 refused: {exc}") from None
            if exc.status in (400, 404, 410):  # it cannot open or no longer has the task: no retry can succeed (issue 46)
                raise PeerFailed(f"server 1 refused the close ({exc}); closing again cannot succeed while it does (if its "
                                 "operator deleted the task, run the collection again as a new task on both servers)") from None
            raise PeerFailed(f"server 1 did not take part in the close ({exc}); close again to retry") from None


def answer(srv: "Server", request: Request, task_id: str, what: str, raw: bytes) -> bytes:
    """Server 1's answer to one message of server 0's (`what`: "reconciliation" or "report-check"),
    admitted by its request tag (`peer_gate`): 403 if the body is not the one the tag covers (its
    head), 400 for a message that does not open (FORGED) or does not fit, 503 with Retry-After while
    its check's round one is still running, 409 for a refused step. The first two are charged to the
    sender's address as failures (`limits.Failures`)."""
    admitted = request.scope.get("dpcdf.peer")
    if not isinstance(admitted, PeerRequest) or admitted.task_id != task_id or len(raw) != admitted.length \
            or not hmac.compare_digest(raw[:len(admitted.head)], admitted.head):
        request.app.state.failures.charge(client_address(request.scope))
        raise HttpError(403, BAD_TAG)
    st = _peer_task(srv, task_id, what)
    try:
        return st.answer_sync(raw) if what == "reconciliation" else st.answer_check(raw)
    except Unopened:
        request.app.state.failures.charge(client_address(request.scope))
        raise HttpError(400, FORGED) from None
    except NotReady as exc:
        raise HttpError(503, str(exc), {"Retry-After": "1"}) from None
    except Refused as exc:
        raise HttpError(409, str(exc)) from None
    except SyncError as exc:
        raise HttpError(400, str(exc)) from None


def _peer_task(srv: "Server", task_id: str, what: str) -> "TaskState":
    """The task a server-to-server message names, on server 1 only; an unknown task gets the answer
    a forged message gets (no probing of task ids here)."""
    if srv.party != 1:
        raise HttpError(400, f"only server 1 takes {what} messages")
    try:
        st = srv.task(task_id)
    except TaskNotFound:
        raise HttpError(400, FORGED) from None
    life = srv.store.lifecycle(task_id)  # issue 24: a task whose key shares are deleted
    assert life is not None  # (`srv.task` found it)
    if life.gone or (life.purge_reason and what == "report-check"):
        # expired or deleted: as unknown to the protocol; released: its check is over (its round one
        # deleted), and an honest server 0 sends nothing after its DONE, so the same answer as an unknown
        # id (a 409 here, before the message is opened, told anyone which tasks are released)
        raise HttpError(400, FORGED)
    return st
