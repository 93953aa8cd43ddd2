"""`TaskContext` (issue 23): one task on one server, built once and passed whole; its derived objects
are the config's own (built once per config), and the refusals of a task's state are domain errors
that `errors.STATUS` answers with their HTTP status."""
from __future__ import annotations

import pytest

from dpcdf.service.protocols.context import StepContext
from dpcdf.service.protocols.reconciliation.exchange import ReconcileHelper, ReconcileLeader
from dpcdf.service.server import errors
from dpcdf.service.server.answers import QueryRefused
from dpcdf.service.protocols.channel import Refused
from dpcdf.service.protocols.reconciliation.maths import SyncError
from dpcdf.service.server.context import (BudgetSpent, CloseRefused, NotClosed, PeerFailed, TaskContext, TaskNotFound,
                                          TooFewReports, pair_key)
from dpcdf.service.server.state import Server, TaskState
from dpcdf.service.task import TaskConfig, token_hash


@pytest.fixture
def two(tmp_path, monkeypatch):
    monkeypatch.setenv("DPCDF_ADMIN_TOKEN", "x" * 20)
    servers = [Server(p, tmp_path / f"s{p}", noise=False) for p in (0, 1)]
    keys = (servers[0].keys.public_hex("x25519"), servers[1].keys.public_hex("x25519"))
    config = TaskConfig({"kind": "uniform", "lo": 0, "hi": 1, "bits": 6}, 1.0, "tree", "substitution", 2,
                        ("http://a", "http://b"), keys, token_hash("t"), verify=False, task_id="ctx")
    for srv in servers:
        srv.register(config)
    yield servers, config
    for srv in servers:
        srv.close()


def test_the_context_is_built_once_from_the_configs_own_objects(two):
    servers, config = two
    contexts = [TaskContext.build(config, p, bytes([p]) * 32, True, srv.keys, srv.store) for p, srv in enumerate(servers)]
    assert contexts[0].pair_key == contexts[1].pair_key == pair_key(config, 0, servers[0].keys)  # the shared key
    for p, ctx in enumerate(contexts):
        assert ctx.party == p and ctx.store is servers[p].store and ctx.task_id == "ctx"
        assert isinstance(ctx, StepContext)  # what the protocol steps take whole
        assert ctx.channel.role == ("leader" if p == 0 else "helper")
        assert ctx.grid is config.make_grid() and ctx.dcf is config.key_dcf() and ctx.check is config.check()
        assert ctx.mechanism is ctx.aggregator.mechanism and ctx.aggregator.dcf is config.dcf()
    assert isinstance(contexts[0].reconciliation(lambda: None, lambda: None), ReconcileLeader)
    assert isinstance(contexts[1].reconciliation(lambda: None, lambda: None), ReconcileHelper)
    assert contexts[0].set_hash([b"a" * 16]) == contexts[1].set_hash([b"a" * 16])
    with pytest.raises(AttributeError):
        contexts[0].party = 1  # frozen: one task, one server, for good


def test_a_tasks_state_is_its_context(two):
    servers, config = two
    evaluator = object()
    servers[0].evaluator = evaluator
    st = servers[0].task("ctx")
    assert isinstance(st, TaskState) and isinstance(st.ctx, TaskContext)
    ctx = st.ctx
    assert (st.config, st.party, st.store, st.pair_key, st.channel, st.aggregator, st.dcf) == \
        (ctx.config, ctx.party, ctx.store, ctx.pair_key, ctx.channel, ctx.aggregator, ctx.dcf)
    assert ctx.aggregator.evaluator is evaluator  # handed to the build, not set afterwards
    servers[0].evaluator = None
    assert servers[1].task("ctx").ctx.party == 1


def test_the_states_refusals_are_domain_errors_with_their_status(two):
    servers, config = two
    st = servers[0].task("ctx")
    with pytest.raises(NotClosed, match="the task is not closed"):
        st.open_for_query([])
    ids = [bytes([i]) * 16 for i in range(1)]
    st.store.add_many("ctx", [(i, b"share") for i in ids])
    st.store.freeze("ctx", st.set_hash)
    st.store.mark("ctx", "reconciled")
    with pytest.raises(TooFewReports, match="the task has 1 reports after reconciliation; queries need at least 2"):
        st.open_for_query([])
    classes = (QueryRefused, TaskNotFound, NotClosed, TooFewReports, BudgetSpent, CloseRefused, PeerFailed)
    assert {cls: errors.status_of(cls("x")) for cls in classes} == \
        {QueryRefused: 400, TaskNotFound: 404, NotClosed: 409, TooFewReports: 403, BudgetSpent: 403, CloseRefused: 409,
         PeerFailed: 502}
    assert all(errors.HANDLERS[cls] is errors.domain_error for cls in errors.STATUS)


def test_an_unknown_task_and_the_closes_refusals_are_domain_errors(two):
    """Server.task's 404 and close()'s 403, 409 and 502, with the messages they had as HttpError."""
    servers, config = two
    with pytest.raises(TaskNotFound, match="^unknown task nope$") as info:
        servers[0].task("nope")
    assert errors.status_of(info.value) == 404 and info.value.task_id == "nope"
    st = servers[0].task("ctx")
    with pytest.raises(TooFewReports, match="^the task has 0 reports; queries need at least 2$"):
        st.close(lambda path, message: b"")
    st.store.add_many("ctx", [(bytes([i]) * 16, b"share") for i in range(2)])

    def refusing(path, message):
        raise Refused("server 1 refused: no")

    def deviating(path, message):
        raise SyncError("not its answer")

    with pytest.raises(CloseRefused, match="^the close cannot go on: server 1 refused: no$"):
        st.close(refusing)
    with pytest.raises(PeerFailed, match=r"^server 1 did not take part in the close as the protocol says \(not its answer\)$"):
        st.close(deviating)


def test_a_second_design_is_budget_spent(two):
    servers, config = two
    st = servers[0].task("ctx")
    ids = [bytes([i]) * 16 for i in range(3)]
    st.store.add_many("ctx", [(i, b"share") for i in ids])
    st.store.freeze("ctx", st.set_hash)
    st.store.mark("ctx", "reconciled")
    st.source = lambda store, upto: []  # no histogram share to make from these shares: only the gate is under test
    assert st.open_for_query([("groups", "[1]", "spent")])[1:] == (3, st.set_hash(ids))
    assert st.open_for_query([("groups", "[1]", "spent")])[1] == 3  # the same design again: answered
    with pytest.raises(BudgetSpent, match="^spent$"):
        st.open_for_query([("groups", "[2]", "spent")])
