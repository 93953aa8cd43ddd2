"""The reconciliation's messages, played by `reconcile.step` between two in-memory report-id sets (no
HTTP): exactly the one-sided ids are dropped, whatever their number, and nothing out of turn is taken."""
import secrets

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpcdf.service import reconcile

KEY, FP = secrets.token_bytes(32), secrets.token_bytes(32)
ids = st.sets(st.binary(min_size=16, max_size=16), max_size=12)


def play(ids0: list[bytes], ids1: list[bytes], key: bytes = KEY, fp: bytes = FP) -> list[reconcile.Step]:
    """Server 0 starts, then 1, 0, 1, each on its own set, each reply sent to the other."""
    steps, sync = [], None
    for party, mine in ((0, ids0), (1, ids1), (0, ids0), (1, ids1)):
        steps.append(reconcile.step(key, fp, party, mine, sync))
        sync = steps[-1].reply
    return steps


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(common=ids, only0=ids, only1=ids)
def test_exactly_the_one_sided_ids_are_dropped(common, only0, only1):
    only0, only1 = only0 - common, only1 - common - only0
    ids0, ids1 = sorted(common | only0), sorted(common | only1)
    steps = play(ids0, ids1)
    assert [s.done for s in steps] == [False, False, True, True]
    assert steps[0].drop == steps[1].drop == frozenset() and steps[3].reply is None
    assert steps[2].drop == only0 and steps[3].drop == only1
    kept0, kept1 = set(ids0) - steps[2].drop, set(ids1) - steps[3].drop
    assert kept0 == kept1 == common
    assert reconcile.set_hash(KEY, sorted(kept0)) == reconcile.set_hash(KEY, sorted(kept1)[::-1])


def test_identical_sets_drop_nothing():
    same = sorted(secrets.token_bytes(16) for _ in range(50))
    steps = play(same, list(same))
    assert all(s.drop == frozenset() for s in steps)
    assert steps[2].reply is not None and reconcile.read_id_list(b"") == []


def test_messages_out_of_turn_forged_or_of_another_task_raise_sync_error():
    mine = [secrets.token_bytes(16) for _ in range(5)]
    first = reconcile.step(KEY, FP, 0, mine, None).reply
    second = reconcile.step(KEY, FP, 1, mine, first).reply
    third = reconcile.step(KEY, FP, 0, mine, second).reply
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
