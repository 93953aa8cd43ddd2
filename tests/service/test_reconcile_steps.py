"""The reconciliation's messages, played by `reconcile.step` between two in-memory report-id sets (no
HTTP): exactly the one-sided ids are dropped, whatever their number, and nothing out of turn is taken."""
import secrets

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpcdf.service import reconcile

KEY, FP = secrets.token_bytes(32), secrets.token_bytes(32)
ids = st.sets(st.binary(min_size=16, max_size=16), max_size=12)


def play(ids0: list[bytes], ids1: list[bytes], key: bytes = KEY, fp: bytes = FP, chunk_ids: int = 1 << 20) -> list[reconcile.Step]:
    """Server 0 starts, server 1 answers, server 0 sends message 3 in chunks, server 1 takes each and
    acknowledges it; returns [0's start, 1's answer, 0's drops, 1's merged drops (done at the last)]."""
    first = reconcile.step(key, fp, 0, ids0, None)
    second = reconcile.step(key, fp, 1, ids1, first.replies[0])
    third = reconcile.step(key, fp, 0, ids0, second.replies[0], chunk_ids)
    fourth, mine = [], list(ids1)
    for chunk in third.replies:  # server 1 applies each chunk's drops before the next, as its store does
        fourth.append(reconcile.step(key, fp, 1, mine, chunk))
        mine = [i for i in mine if i not in fourth[-1].drop]
    for move, expected in zip(fourth, third.acks):
        reconcile.check_ack(key, fp, move.replies[0], expected)
    assert [m.done for m in fourth] == [False] * (len(fourth) - 1) + [True]
    merged = reconcile.Step((), frozenset().union(*(m.drop for m in fourth)), True)
    return [first, second, third, merged]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(common=ids, only0=ids, only1=ids)
def test_exactly_the_one_sided_ids_are_dropped(common, only0, only1):
    only0, only1 = only0 - common, only1 - common - only0
    ids0, ids1 = sorted(common | only0), sorted(common | only1)
    steps = play(ids0, ids1)
    assert [s.done for s in steps] == [False, False, True, True]
    assert steps[0].drop == steps[1].drop == frozenset()
    assert steps[2].drop == only0 and steps[3].drop == only1
    kept0, kept1 = set(ids0) - steps[2].drop, set(ids1) - steps[3].drop
    assert kept0 == kept1 == common
    assert reconcile.set_hash(KEY, sorted(kept0)) == reconcile.set_hash(KEY, sorted(kept1)[::-1])


def test_identical_sets_drop_nothing():
    same = sorted(secrets.token_bytes(16) for _ in range(50))
    steps = play(same, list(same))
    assert all(s.drop == frozenset() for s in steps)
    assert len(steps[2].replies) == 1 and reconcile.read_id_list(b"") == []


def test_messages_out_of_turn_forged_or_of_another_task_raise_sync_error():
    mine = [secrets.token_bytes(16) for _ in range(5)]
    first = reconcile.step(KEY, FP, 0, mine, None).replies[0]
    second = reconcile.step(KEY, FP, 1, mine, first).replies[0]
    third = reconcile.step(KEY, FP, 0, mine, second).replies[0]
    forged = bytearray(first)
    forged[-1] ^= 1
    cases = [(1, None, "server 1 closes with server 0's"), (0, first, "round 2 here, not 1"),
             (0, third, "round 2 here, not 3"), (1, second, "round 1 or 3 here, not 2"),
             (1, bytes(forged), "not the other server's"), (1, b"zz", "the bytes the other server sent"),
             (1, 5, "the bytes the other server sent"), (1, first.hex(), "the bytes the other server sent")]
    for party, message, why in cases:
        with pytest.raises(reconcile.SyncError, match=why):
            reconcile.step(KEY, FP, party, mine, message)
    for key, fp in ((secrets.token_bytes(32), FP), (KEY, secrets.token_bytes(32))):  # replayed to another task
        with pytest.raises(reconcile.SyncError, match="not the other server's"):
            reconcile.step(key, fp, 1, mine, first)


def test_any_number_of_differences_is_reconciled_exactly():
    """Thousands of one-sided ids on each side (every bucket differs): all dropped, no common one."""
    common = [secrets.token_bytes(16) for _ in range(3000)]
    only0 = [secrets.token_bytes(16) for _ in range(5000)]
    only1 = [secrets.token_bytes(16) for _ in range(4000)]
    steps = play(common + only0, only1 + common)
    assert steps[2].drop == frozenset(only0) and steps[3].drop == frozenset(only1)


def test_message_3_comes_in_chunks_each_acknowledged_and_an_empty_or_wrong_ack_is_refused():
    common = [secrets.token_bytes(16) for _ in range(50)]
    only1 = [secrets.token_bytes(16) for _ in range(25)]
    steps = play(common, common + only1, chunk_ids=10)
    third = steps[2]
    assert len(third.replies) == 3 and steps[3].drop == frozenset(only1)
    first_ack = reconcile.step(KEY, FP, 1, common + only1, third.replies[0]).replies[0]
    reconcile.check_ack(KEY, FP, first_ack, third.acks[0])
    for bad, expected in ((b"", third.acks[0]), (first_ack, third.acks[1]), (third.replies[0], third.acks[0])):
        with pytest.raises(reconcile.SyncError):
            reconcile.check_ack(KEY, FP, bad, expected)


def test_a_lost_or_replayed_chunk_never_ends_the_close_on_two_sets():
    """The review's attack: chunk 0 never reaches server 1 (its old ack is replayed), the last does.
    Server 1 is not done, and its ack of the last chunk does not match: server 0 refuses it."""
    common = [secrets.token_bytes(16) for _ in range(40)]
    only1 = [secrets.token_bytes(16) for _ in range(25)]
    ids1 = common + only1
    first = reconcile.step(KEY, FP, 0, common, None)
    second = reconcile.step(KEY, FP, 1, ids1, first.replies[0])
    third = reconcile.step(KEY, FP, 0, common, second.replies[0], chunk_ids=10)
    last = reconcile.step(KEY, FP, 1, ids1, third.replies[-1])  # the last chunk arrives alone
    assert not last.done
    with pytest.raises(reconcile.SyncError, match="differs from server 0's"):
        reconcile.check_ack(KEY, FP, last.replies[0], third.acks[-1])
    other = reconcile.step(KEY, FP, 0, common[1:], second.replies[0], chunk_ids=10)  # an earlier exchange's list
    stale = reconcile.step(KEY, FP, 1, ids1, other.replies[0])
    with pytest.raises(reconcile.SyncError, match="another chunk"):  # an ack of another exchange's chunk 0
        reconcile.check_ack(KEY, FP, stale.replies[0], third.acks[0])


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
