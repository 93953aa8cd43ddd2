"""An unverified task's histogram share (issue 44, `Aggregator.grid_histogram`): its keys' summed shares
at every grid index, kept from the first query (or the close) so that every later query reads
O(points); the same bits as evaluating the keys at those points."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fss import DCF
from dpcdf.release.mechanisms import TreeMechanism
from dpcdf.service.server.aggregate import Aggregator, Histogram, partial_sums


@settings(max_examples=15, deadline=None)
@given(bits=st.integers(1, 10), width=st.integers(1, 3), n=st.integers(0, 40), seed=st.integers(0, 2**32 - 1))
def test_the_histogram_share_is_the_keys_sums_at_every_point(bits, width, n, seed):
    rng = np.random.default_rng(seed)  # test data only
    dcf = DCF(bits, 64, width, cmp="ge")
    size = 1 << bits
    betas = rng.integers(0, 2**63, (max(n, 1), width), dtype=np.uint64)[:n] if width > 1 else 1
    keys = dcf.gen_batch(rng.integers(0, size, n), betas)[rng.integers(0, 2)] if n else None
    shards = [keys.select(np.arange(0, n // 2)), keys.select(np.arange(n // 2, n))] if n else []
    agg = Aggregator(dcf, TreeMechanism(max(size, 2), 1.0), b"s" * 32, "t", noise=False)
    hist = agg.grid_histogram(shards, size, "digest")
    assert isinstance(hist, Histogram) and hist.set_hash == "digest"
    points = np.concatenate([[0, size - 1], rng.integers(0, size, 20)])
    np.testing.assert_array_equal(agg.sums(hist, points), partial_sums(dcf, shards, points))
