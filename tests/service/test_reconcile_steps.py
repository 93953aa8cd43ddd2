"""The reconciliation's arithmetic (`reconcile.differences`, `drops`, `take_drops`, `check_ack`) played
between two in-memory report-id sets (no channel, no HTTP): exactly the one-sided ids are dropped,
whatever their number, and nothing malformed is taken. The channel's sealing and one-shot rule:
tests/service/test_channel.py."""
import secrets
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpcdf.service.protocols.reconciliation import maths as reconcile

KEY = secrets.token_bytes(32)
ids = st.sets(st.binary(min_size=16, max_size=16), max_size=12)


@dataclass
class Move:
    drop: frozenset
    done: bool


def play(ids0: list[bytes], ids1: list[bytes], key: bytes = KEY, chunk_ids: int = 1 << 20) -> tuple[reconcile.Drops, Move]:
    """Server 0 sends its digests, server 1 answers, server 0 sends message 3 in chunks, server 1 takes
    each and acknowledges it; returns server 0's drops and server 1's merged drops (done at the last)."""
    answer = reconcile.differences(key, ids1, reconcile.bucket_digests(key, ids0))
    plan = reconcile.drops(key, ids0, answer, chunk_ids)
    taken, mine = [], list(ids1)
    for body in plan.bodies:  # server 1 applies each chunk's drops before the next, as its store does
        taken.append(reconcile.take_drops(key, mine, body))
        mine = [i for i in mine if i not in taken[-1].drop]
    for move, expected in zip(taken, plan.acks):
        reconcile.check_ack(move.ack, expected)
    assert [t.done for t in taken] == [False] * (len(taken) - 1) + [True]
    return plan, Move(frozenset().union(*(t.drop for t in taken)), True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(common=ids, only0=ids, only1=ids)
def test_exactly_the_one_sided_ids_are_dropped(common, only0, only1):
    only0, only1 = only0 - common, only1 - common - only0
    ids0, ids1 = sorted(common | only0), sorted(common | only1)
    plan, taken = play(ids0, ids1)
    assert plan.drop == only0 and taken.drop == only1
    kept0, kept1 = set(ids0) - plan.drop, set(ids1) - taken.drop
    assert kept0 == kept1 == common
    assert reconcile.set_hash(KEY, sorted(kept0)) == reconcile.set_hash(KEY, sorted(kept1)[::-1])


def test_identical_sets_drop_nothing():
    same = sorted(secrets.token_bytes(16) for _ in range(50))
    plan, taken = play(same, list(same))
    assert plan.drop == taken.drop == frozenset()
    assert len(plan.bodies) == 1 and reconcile.read_id_list(b"") == []


def test_a_replayed_close_sends_the_same_messages_after_its_drops():
    """Server 0 run again after it dropped (a crash after message 2): the same chunks, nothing more to drop."""
    common = [secrets.token_bytes(16) for _ in range(30)]
    only0, only1 = [secrets.token_bytes(16) for _ in range(7)], [secrets.token_bytes(16) for _ in range(9)]
    answer = reconcile.differences(KEY, common + only1, reconcile.bucket_digests(KEY, common + only0))
    first = reconcile.drops(KEY, sorted(common + only0), answer, chunk_ids=4)
    again = reconcile.drops(KEY, sorted(common), answer, chunk_ids=4)
    assert first.drop == frozenset(only0) and again.drop == frozenset()
    assert first.bodies == again.bodies and first.acks == again.acks


def test_malformed_messages_raise_sync_error():
    mine = [secrets.token_bytes(16) for _ in range(5)]
    with pytest.raises(reconcile.SyncError, match="wrong length"):
        reconcile.differences(KEY, mine, b"x" * 10)
    with pytest.raises(reconcile.SyncError, match="wrong length"):
        reconcile.drops(KEY, mine, b"x" * 10)
    with pytest.raises(reconcile.SyncError, match="truncated"):
        reconcile.take_drops(KEY, mine, b"x" * 10)


def test_any_number_of_differences_is_reconciled_exactly():
    """Thousands of one-sided ids on each side (every bucket differs): all dropped, no common one."""
    common = [secrets.token_bytes(16) for _ in range(3000)]
    only0 = [secrets.token_bytes(16) for _ in range(5000)]
    only1 = [secrets.token_bytes(16) for _ in range(4000)]
    plan, taken = play(common + only0, only1 + common)
    assert plan.drop == frozenset(only0) and taken.drop == frozenset(only1)


def test_message_3_comes_in_chunks_each_acknowledged_and_an_empty_or_wrong_ack_is_refused():
    common = [secrets.token_bytes(16) for _ in range(50)]
    only1 = [secrets.token_bytes(16) for _ in range(25)]
    plan, taken = play(common, common + only1, chunk_ids=10)
    assert len(plan.bodies) == 3 and taken.drop == frozenset(only1)
    first_ack = reconcile.take_drops(KEY, common + only1, plan.bodies[0]).ack
    reconcile.check_ack(first_ack, plan.acks[0])
    for bad, expected in ((b"", plan.acks[0]), (first_ack, plan.acks[1]), (plan.bodies[0], plan.acks[0])):
        with pytest.raises(reconcile.SyncError):
            reconcile.check_ack(bad, expected)


def test_a_lost_or_replayed_chunk_never_ends_the_close_on_two_sets():
    """The review's attack: chunk 0 never reaches server 1 (its old ack is replayed), the last does.
    Server 1 is not done, and its ack of the last chunk does not match: server 0 refuses it."""
    common = [secrets.token_bytes(16) for _ in range(40)]
    only1 = [secrets.token_bytes(16) for _ in range(25)]
    ids1 = common + only1
    answer = reconcile.differences(KEY, ids1, reconcile.bucket_digests(KEY, common))
    plan = reconcile.drops(KEY, common, answer, chunk_ids=10)
    last = reconcile.take_drops(KEY, ids1, plan.bodies[-1])  # the last chunk arrives alone
    assert not last.done
    with pytest.raises(reconcile.SyncError, match="differs from server 0's"):
        reconcile.check_ack(last.ack, plan.acks[-1])
    other = reconcile.drops(KEY, common[1:], answer, chunk_ids=10)  # an earlier exchange's list
    stale = reconcile.take_drops(KEY, ids1, other.bodies[0])
    with pytest.raises(reconcile.SyncError, match="another chunk"):  # an ack of another exchange's chunk 0
        reconcile.check_ack(stale.ack, plan.acks[0])


def test_malformed_id_tables_and_lists_are_sync_errors():
    differ = reconcile.from_bitmap(reconcile.bitmap([3, 9]))
    grouped = {3: [b"a" * 16], 9: [b"b" * 16, b"c" * 16]}
    table = reconcile.id_table(differ, grouped)
    assert reconcile.read_id_table(table, differ) == {3: {b"a" * 16}, 9: {b"b" * 16, b"c" * 16}}
    for bad, why in ((table[:-1], "truncated"), (table + b"x", "trailing bytes")):
        with pytest.raises(reconcile.SyncError, match=why):
            reconcile.read_id_table(bad, differ)
    with pytest.raises(reconcile.SyncError, match="not a list of report ids"):
        reconcile.read_id_list(b"x" * 17)
