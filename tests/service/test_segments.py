"""Key shares kept for evaluation: columnar segment files, checksummed in the store, mapped without
copying, rebuilt from the store's rows whenever they are missing, corrupt or stale."""
import hashlib

import numpy as np
import pytest

from fss import DCF, DPF, KeyBatch, ParameterError
from dpcdf.errors import DpcdfError
from dpcdf.service.storage import segments
from dpcdf.service.server.aggregate import partial_sums
from dpcdf.service.storage.records import CollectionOpen, SegmentFile, StoreError
from dpcdf.service.storage.store import Store

DCF10 = DCF(bits=10, out_bits=64)
POINTS = np.arange(1024)


def _keys(n, seed=0, dcf=DCF10):
    alphas = np.random.default_rng(seed).integers(0, 1 << dcf.bits, n)
    return dcf.gen_batch(alphas, 1)


def test_from_grouped_takes_the_arrays_without_copying_and_checks_them():
    k0, _ = _keys(37)
    again = KeyBatch.from_grouped(k0.params, 0, 37, k0.seeds, k0.cw_seed, k0.cw_t, k0.cw_v)
    for name in segments.ARRAYS:
        assert getattr(again, name) is getattr(k0, name)
    np.testing.assert_array_equal(DCF10.eval_sum(again, POINTS), DCF10.eval_sum(k0, POINTS))
    with pytest.raises(ParameterError, match="cw_t"):  # 37 keys are 3 groups, not 2
        KeyBatch.from_grouped(k0.params, 0, 37, k0.seeds, k0.cw_seed, k0.cw_t[:2], k0.cw_v)
    with pytest.raises(ParameterError, match="seeds"):
        KeyBatch.from_grouped(k0.params, 0, 37, k0.seeds.astype(np.int64), k0.cw_seed, k0.cw_t, k0.cw_v)
    with pytest.raises(ParameterError, match="C-contiguous"):
        KeyBatch.from_grouped(k0.params, 0, 37, k0.seeds[:, :, ::-1], k0.cw_seed, k0.cw_t, k0.cw_v)
    with pytest.raises(ParameterError, match="party"):
        KeyBatch.from_grouped(k0.params, 2, 37, k0.seeds, k0.cw_seed, k0.cw_t, k0.cw_v)


def test_write_and_load_map_the_same_keys(tmp_path):
    k0, _ = _keys(1000, 1)
    parts = [k0.select(slice(0, 333)), k0.select(slice(333, 1000))]
    files = segments.write(tmp_path, parts, "set")
    assert len(files) == 8 and {f.n for f in files} == {333, 667}
    for f in files:
        assert hashlib.sha256((tmp_path / f.file).read_bytes()).hexdigest() == f.sha256
    loaded = segments.load(tmp_path, files, DCF10, 0)
    assert isinstance(loaded[0].seeds, np.memmap) and isinstance(loaded[0], KeyBatch)
    for got, want in zip(loaded, parts):
        for a, b in zip(got.logical(), want.logical()):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(partial_sums(DCF10, loaded, POINTS), DCF10.eval_sum(k0, POINTS))
    piece = segments.piece(loaded[1], 2, 10, 8 * 16)
    assert np.shares_memory(piece.cw_seed, loaded[1].cw_seed)
    np.testing.assert_array_equal(DCF10.eval_sum(piece, POINTS), DCF10.eval_sum(parts[1].select(slice(32, 160)), POINTS))
    ranges = segments.group_ranges(loaded[1], 4)  # 667 keys: 42 groups, the last one of 11 keys
    assert ranges[0][0] == 0 and ranges[-1][1] == 42 and sum(r[2] for r in ranges) == 667


def _reconciled_store(tmp_path, n, dcf=DCF10, seed=2, drop=()):
    store = Store(tmp_path / "server.sqlite")
    store.add_task("t1", "{}", b"fp", b"seed")
    k0, _ = _keys(n, seed, dcf)
    ids = [i.to_bytes(16, "little") for i in range(n)]
    store.add_many("t1", [(ids[i], k0[i].to_bytes()) for i in range(n)])
    store.freeze("t1", lambda got: hashlib.sha256(b"".join(got)).hexdigest())
    if drop:
        store.exclude("t1", [ids[i] for i in drop], lambda got: hashlib.sha256(b"".join(got)).hexdigest())
    store.mark("t1", "reconciled")
    keep = np.setdiff1d(np.arange(n), np.asarray(drop, np.int64))
    return store, k0.select(keep)


@pytest.mark.parametrize("block", [16, 32, 1 << 15])
def test_build_streams_the_reconciled_rows_into_shards_and_records_them(tmp_path, monkeypatch, block):
    monkeypatch.setattr(segments, "SHARD_KEYS", 64)
    monkeypatch.setattr(segments, "BLOCK_KEYS", block)  # blocks of 16 or 32 keys per shard of 64, or the shard's
    store, kept = _reconciled_store(tmp_path, 300, drop=(5, 200))
    shards = segments.open_or_build(store, "t1", DCF10, 0, tmp_path)
    assert [len(s) for s in shards] == [64, 64, 64, 64, 42]
    recorded = store.segments("t1")
    assert len(recorded) == 20 and all(f.set_hash == store.frozen("t1").digest for f in recorded)
    np.testing.assert_array_equal(partial_sums(DCF10, shards, POINTS), DCF10.eval_sum(kept, POINTS))
    # a second load maps the recorded files: nothing rewritten
    stamps = {p.name: p.stat().st_mtime_ns for p in segments.task_dir(tmp_path, "t1").iterdir()}
    again = segments.open_or_build(store, "t1", DCF10, 0, tmp_path)
    assert {p.name: p.stat().st_mtime_ns for p in segments.task_dir(tmp_path, "t1").iterdir()} == stamps
    np.testing.assert_array_equal(partial_sums(DCF10, again, POINTS), DCF10.eval_sum(kept, POINTS))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "stale"])
def test_a_damaged_or_stale_segment_is_rebuilt_never_used(tmp_path, damage):
    store, kept = _reconciled_store(tmp_path, 100, seed=3)
    segments.open_or_build(store, "t1", DCF10, 0, tmp_path)
    directory = segments.task_dir(tmp_path, "t1")
    target = directory / store.segments("t1")[1].file  # cw_seed of shard 0
    if damage == "flip":
        raw = bytearray(target.read_bytes())
        raw[-5] ^= 1
        target.write_bytes(bytes(raw))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-16])
    elif damage == "delete":
        target.unlink()
    else:  # recorded for another report set
        files = store.segments("t1")
        store.db.execute("UPDATE segments SET set_hash = 'other' WHERE task_id = 't1'")
        assert store.segments("t1")[0].set_hash == "other" and len(files) == 4
    with pytest.raises(segments.SegmentError):
        if damage != "stale":
            segments.load(directory, store.segments("t1"), DCF10, 0)
        else:
            raise segments.SegmentError("stale")
    shards = segments.open_or_build(store, "t1", DCF10, 0, tmp_path)
    np.testing.assert_array_equal(partial_sums(DCF10, shards, POINTS), DCF10.eval_sum(kept, POINTS))
    assert all(f.set_hash == store.frozen("t1").digest for f in store.segments("t1"))
    segments.load(directory, store.segments("t1"), DCF10, 0)  # whole again


def test_the_store_records_segments_only_of_a_reconciled_task_and_its_set(tmp_path):
    store = Store(tmp_path / "server.sqlite")
    store.add_task("t1", "{}", b"fp", b"seed")
    record = [SegmentFile(0, "seeds", 1, "00000.seeds.npy", "0" * 64, "h")]
    with pytest.raises(CollectionOpen):
        store.record_segments("t1", record)
    store.freeze("t1", lambda ids: "h")
    with pytest.raises(StoreError, match="not reconciled"):
        store.record_segments("t1", record)
    store.mark("t1", "reconciled")
    with pytest.raises(StoreError, match="another report set"):
        store.record_segments("t1", [record[0]._replace(set_hash="x")])
    store.record_segments("t1", record)
    assert store.segments("t1") == record
    store.drop_segments("t1")
    assert store.segments("t1") == []
    assert issubclass(segments.SegmentError, DpcdfError) and issubclass(StoreError, DpcdfError)


def test_width_and_32_bit_payloads_round_trip(tmp_path):
    dcf = DCF(bits=8, out_bits=32, width=3)
    k0, _ = dcf.gen_batch(np.random.default_rng(4).integers(0, 256, 50), [1, 2, 3])
    files = segments.write(tmp_path, [k0], "s")
    (loaded,) = segments.load(tmp_path, files, dcf, 0)
    assert loaded.cw_v.dtype == np.uint32
    np.testing.assert_array_equal(dcf.eval_sum(loaded, np.arange(256)), dcf.eval_sum(k0, np.arange(256)))
    with pytest.raises(segments.SegmentError):
        segments.load(tmp_path, files, DCF10, 0)  # another function's keys


@pytest.mark.parametrize("dcf", [DCF10, DCF(bits=6, out_bits=32, width=2, cmp="lt"), DCF(bits=7, out_bits=20),
                                 DCF(bits=5, width=2, group="p61"), DPF(bits=6, out_bits=64)], ids=str)
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 100])
def test_decode_block_gives_the_arrays_of_the_keys_decoded_one_by_one(dcf, n):
    """The build's vectorized decode (`fss.layout.batch_from_rows` over the stored keys' bytes) is
    bit-identical to the keys parsed one by one (`key_from_bytes`, the single-key path, not the
    batch kernel under test: review of issue 43), padding of the last group included."""
    alphas = np.random.default_rng(n).integers(0, 1 << dcf.bits, n)
    beta = [1] * dcf.params.width if dcf.params.width > 1 else 1
    for party, batch in enumerate(dcf.gen_batch(alphas, beta)):
        shares = [batch[i].to_bytes() for i in range(n)]
        got = segments.decode_block(dcf, party, n, b"".join(shares))
        want = KeyBatch.concatenate([dcf.key_from_bytes(s, party).batch for s in shares]) if n else None
        for name in segments.ARRAYS:
            assert got[name].flags.c_contiguous
            if n:
                assert got[name].dtype == getattr(want, name).dtype
                np.testing.assert_array_equal(got[name], getattr(want, name))
            else:
                assert got[name].shape[0] == 0


def test_decode_block_refuses_what_is_not_a_key_of_the_task():
    k0, _ = _keys(20, 6)
    blob = bytearray(b"".join(k0[i].to_bytes() for i in range(20)))
    p = DCF10.params
    with pytest.raises(segments.SegmentError, match="not .*-byte keys"):
        segments.decode_block(DCF10, 0, 20, bytes(blob[:-1]))
    with pytest.raises(segments.SegmentError, match="for party 1"):
        segments.decode_block(DCF10, 1, 20, bytes(blob))  # party 0's keys read as party 1's
    reserved = bytearray(blob)
    reserved[3 * p.key_size + 8 + 16] |= 1  # key 3: bit 0 of its first seed correction word
    with pytest.raises(segments.SegmentError, match="reserved bit"):
        segments.decode_block(DCF10, 0, 20, bytes(reserved))
    padded = bytearray(blob)
    padded[5 * p.key_size + 8 + 16 * 11 + p.t_bytes - 1] |= 0x80  # key 5: past its 2 * 10 control bits
    with pytest.raises(segments.SegmentError, match="padding"):
        segments.decode_block(DCF10, 0, 20, bytes(padded))


def test_a_build_that_fails_midway_leaves_no_segment_and_the_next_open_rebuilds(tmp_path, monkeypatch):
    """A crash or error while writing (here: the second block's decode fails) leaves only temporary
    files, which nothing records; the next open builds the segments whole from the store."""
    monkeypatch.setattr(segments, "SHARD_KEYS", 64)
    monkeypatch.setattr(segments, "BLOCK_KEYS", 32)
    store, kept = _reconciled_store(tmp_path, 150, seed=7)
    real, calls = segments.decode_block, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*args)

    monkeypatch.setattr(segments, "decode_block", failing)
    with pytest.raises(OSError, match="disk full"):
        segments.open_or_build(store, "t1", DCF10, 0, tmp_path)
    directory = segments.task_dir(tmp_path, "t1")
    assert store.segments("t1") == [] and not list(directory.glob("*.npy")) and not list(directory.glob("*.tmp"))
    monkeypatch.setattr(segments, "decode_block", real)
    shards = segments.open_or_build(store, "t1", DCF10, 0, tmp_path)
    assert [len(s) for s in shards] == [64, 64, 22]
    np.testing.assert_array_equal(partial_sums(DCF10, shards, POINTS), DCF10.eval_sum(kept, POINTS))


def test_a_build_whose_rows_do_not_add_up_to_the_closed_count_records_nothing(tmp_path):
    store, _ = _reconciled_store(tmp_path, 40, seed=8)
    store.db.execute("UPDATE tasks SET report_count = 41 WHERE task_id = 't1'")
    with pytest.raises(segments.SegmentError, match="do not add up"):
        segments.open_or_build(store, "t1", DCF10, 0, tmp_path)
    store.db.execute("UPDATE tasks SET report_count = 39 WHERE task_id = 't1'")
    with pytest.raises(segments.SegmentError, match="more rows"):
        segments.open_or_build(store, "t1", DCF10, 0, tmp_path)
    assert store.segments("t1") == [] and not list(segments.task_dir(tmp_path, "t1").glob("*.npy*"))
