"""eval_grid: every key's shares at the first `size` points of the domain, pinned to eval_batch at each
point (both parties, every comparison, signed or not, both groups, widths 1-3, the DPF too), to the
function's values after reconstruction, and on every backend to the portable one.

Compile time rules the runtime here (a fused grid kernel per width, DCF or DPF, group and AES flavour,
about a second each): the properties run on the portable backend and the fastest fused one (every
width and kind), the other fused flavour on the kernels of `test_every_backend_equals_portable`; gen
and the eval_batch oracle run on the portable backend (the fused ones are pinned to it in
test_backend.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fss import DCF, DPF, Key, KeyBatch, KeyMismatchError, ParameterError, backend, portable

from helpers import CMPS

KINDS = CMPS + ("eq",)
P = (1 << 61) - 1
FASTEST = backend.available()[-1]  # vaes, else aesni, else portable
BACKENDS = sorted({"portable", FASTEST})


@pytest.fixture(params=BACKENDS)
def on_backend(request):
    with backend.using(request.param):
        yield request.param


def make(kind, bits, width=1, signed=False, group="ring", out_bits=None):
    if kind == "eq":
        return DPF(bits, out_bits, width, signed=signed, group=group)
    return DCF(bits, out_bits, width, cmp=kind, signed=signed, group=group)


def truth(fn, alphas, xs, betas):
    """(n, size, width): betas[k] where `xs[j] cmp alphas[k]`, else 0."""
    a, x = np.asarray(alphas, object)[:, None], np.asarray(xs, object)[None, :]
    holds = {"lt": x < a, "le": x <= a, "gt": x > a, "ge": x >= a, "eq": x == a}[fn.params.cmp].astype(bool)
    return np.where(holds[:, :, None], betas[:, None, :], np.uint64(0)).astype(np.uint64)


def gen(fn, alphas, betas):
    with backend.using("portable"):  # the same keys on every backend (test_backend.py)
        return fn.gen_batch(alphas, betas)


def points_of(fn, size):
    lo = fn.params.domain_range()[0]
    return [lo + j for j in range(size)]


def by_eval_batch(fn, keys, xs):
    """(n, size, width) from one eval_batch over every (key, point) pair."""
    n, m = len(keys), len(xs)
    with backend.using("portable"):
        got = fn.eval_batch(keys.select(np.repeat(np.arange(n), m)), np.tile(np.array(xs, dtype=object), n))
    return got.reshape(n, m, fn.width)


def check(fn, alphas, betas, size, k0, k1):
    xs = points_of(fn, size)
    g0, g1 = fn.eval_grid(k0, size), fn.eval_grid(k1, size)
    shape = (len(alphas), size) if fn.width == 1 else (len(alphas), size, fn.width)
    assert g0.shape == g1.shape == shape and g0.dtype == g1.dtype == np.uint64
    g0, g1 = g0.reshape(len(alphas), size, fn.width), g1.reshape(len(alphas), size, fn.width)
    bound = P if fn.params.prime else 1 << fn.out_bits
    assert int(g0.max(initial=0)) < bound and int(g1.max(initial=0)) < bound
    np.testing.assert_array_equal(g0, by_eval_batch(fn, k0, xs))
    np.testing.assert_array_equal(g1, by_eval_batch(fn, k1, xs))
    np.testing.assert_array_equal(fn.reconstruct(g0, g1), truth(fn, alphas, xs, betas))


@st.composite
def setups(draw):
    kind = draw(st.sampled_from(KINDS))
    group = draw(st.sampled_from(["ring", "p61"]))
    bits = draw(st.one_of(st.integers(1, 12), st.sampled_from([16, 33, 63, 64])))
    out_bits = None if group == "p61" else draw(st.one_of(st.integers(1, 64), st.sampled_from([1, 32, 64])))
    width = draw(st.integers(1, 3))
    fn = make(kind, bits, width, draw(st.booleans()), group, out_bits)
    lo, hi = fn.params.domain_range()
    n = draw(st.integers(1, 20))
    edges = st.sampled_from([lo, hi, lo + 1, hi - 1, 0, -1, 1])
    alphas = draw(st.lists(st.one_of(edges, st.integers(lo, hi)), min_size=n, max_size=n))
    alphas = [min(max(a, lo), hi) for a in alphas]
    size = draw(st.one_of(st.integers(1, min(1 << bits, 300)), st.sampled_from([1, min(1 << bits, 256)])))
    m = fn.params.modulus
    betas = np.array(draw(st.lists(st.lists(st.integers(0, m - 1), min_size=width, max_size=width),
                                   min_size=n, max_size=n)), dtype=np.uint64)
    return fn, alphas, betas, size


@pytest.mark.usefixtures("on_backend")
@settings(max_examples=40)
@given(setup=setups())
def test_equals_eval_batch_and_reconstructs(setup):
    fn, alphas, betas, size = setup
    k0, k1 = gen(fn, np.array(alphas, dtype=object), betas if fn.width > 1 else betas[:, 0])
    check(fn, alphas, betas, size, k0, k1)


@pytest.mark.usefixtures("on_backend")
@pytest.mark.parametrize("group", ["ring", "p61"])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_every_alpha_every_size_on_small_domains(kind, signed, group):
    for bits in range(1, 5):
        width = 1 + bits % 3  # 2, 3, 1, 2
        fn = make(kind, bits, width, signed, group, None if group == "p61" else 5 + bits)
        lo, hi = fn.params.domain_range()
        alphas = list(range(lo, hi + 1))
        betas = (np.arange(len(alphas) * width, dtype=np.uint64).reshape(-1, width) * np.uint64(7) + np.uint64(1)) \
            % np.uint64(fn.params.modulus)
        k0, k1 = gen(fn, alphas, betas if width > 1 else betas[:, 0])
        for size in range(1, (1 << bits) + 1):
            check(fn, alphas, betas, size, k0, k1)


@pytest.mark.parametrize("fn", [DCF(10, group="p61", cmp="ge"), DCF(10, group="p61", cmp="ge", width=2),
                                DCF(10, group="p61", cmp="ge", width=2, version=1), DCF(8, group="p61", cmp="lt", version=1),
                                DCF(11, 64, 1, cmp="gt"), DCF(9, 20, 3, cmp="le", signed=True),
                                DPF(10, group="p61", width=3), DCF(10, group="p61", cmp="ge", width=6),
                                DCF(7, 64, 8, cmp="lt"), DCF(6, 64, 9, cmp="ge")],  # 6: a verified calibration task's keys; 9: portable
                         ids=repr)
def test_every_backend_equals_portable(fn):
    n = 37  # two full groups of 16 and a partial one
    lo, hi = fn.params.domain_range()
    alphas = [lo, hi, 0] + [lo + (i * 7919) % (hi - lo + 1) for i in range(n - 3)]
    k0, k1 = gen(fn, alphas, -1)  # -1: the largest element, p - 1 or 2^out_bits - 1
    for size in sorted({1, 5, min(1000, 1 << fn.bits), 1 << fn.bits}):
        want = [portable.eval_grid(k, 0, size, False) for k in (k0, k1)]
        for name in backend.available():
            with backend.using(name):
                for k, w in zip((k0, k1), want):
                    np.testing.assert_array_equal(backend.eval_grid(k, 0, size, False), w)
                    start = (1 << fn.bits) - size
                    np.testing.assert_array_equal(backend.eval_grid(k, start, size, True),
                                                  portable.eval_grid(k, start, size, True))
    if fn.params.cmp in ("eq", "ge"):  # the largest payload, on the default backend
        betas = np.full((n, fn.width), fn.params.modulus - 1, np.uint64)
        check(fn, alphas, betas, min(300, 1 << fn.bits), k0, k1)


def test_block_layout_kernel_width_4_above_a_subtree_and_its_fallback():
    """The `_blockgrid` step (even widths over F_p on vaes256 / aesni) at width 4 over 12 bits (a first
    stage above the 2^10-leaf subtrees), and on every backend a batch with bit 0 of a seed correction
    set (no key gen makes or the codec accepts; the step keeps t there) sent to the portable backend."""
    fn = DCF(12, width=4, group="p61", cmp="ge")
    rng = np.random.default_rng(22)
    k0, k1 = gen(fn, rng.integers(0, 1 << 12, 17), rng.integers(0, P, (17, 4)).astype(np.uint64))
    for k in (k0, k1):
        want = [portable.eval_grid(k, 1000, 3000, True), portable.eval_grid(k, 5, 1500, False)]
        for name in BACKENDS:  # the fastest kernel (width 4 compiles for it in test_check_mac anyway)
            with backend.using(name):
                assert np.array_equal(backend.eval_grid(k, 1000, 3000, True), want[0]), name
                assert np.array_equal(backend.eval_grid(k, 5, 1500, False), want[1]), name
    odd = DCF(6, width=2, group="p61", cmp="ge")
    pair = gen(odd, [3, 40], np.array([[1, 2], [3, 4]], np.uint64))
    cw_seed = pair[0].cw_seed.copy()  # the batches' arrays are read-only: a new pair with the bits set
    cw_seed[:, :, 0, :2] |= np.uint64(1)  # both parties' (one array), every level
    pair = [KeyBatch.from_grouped(k.params, k.party, k.n, k.seeds, cw_seed, k.cw_t, k.cw_v) for k in pair]
    for keys in pair:
        for name in backend.available():
            with backend.using(name):
                assert np.array_equal(backend.eval_grid(keys, 0, 64, True), portable.eval_grid(keys, 0, 64, True)), name


# round one's two shapes (count, label: `round_one.pass_sums`) run on every backend; the others on the
# portable and the fastest: a fused kernel is compiled per shape and tier (about 5 s each from a cold
# cache), the walk is the tier's (pinned on every tier above) and the row's reduction the same code on all
@pytest.mark.parametrize("width, c, offsets, tiers", [(2, 1, [0, 0, 1], "all"), (4, 2, [0, 0, 2], "all"),
                                                     (1, 1, [0], BACKENDS), (2, 1, [1, 0, 1, 0], BACKENDS),
                                                     (6, 3, [0, 0, 0, 2, 3, 3], BACKENDS)])  # the calibration check's six
def test_eval_grid_sums_equals_the_sums_of_eval_grid(width, c, offsets, tiers):
    """`eval_grid_sums` (the grid kernel with each key's row reduced in cache, `fss._linear`) against
    Python integers on `eval_grid`'s values, both orders, one and two threads, a partial subtree and a
    first stage above the subtrees (12 bits), weights and payloads at p - 1."""
    rng = np.random.default_rng(width * 10 + len(offsets))
    for cmp, bits, size in (("ge", 10, 1024), ("lt", 12, 3000), ("ge", 5, 19)):
        fn = DCF(bits, width=width, group="p61", cmp=cmp)
        n = 37
        betas = rng.integers(0, P, (n, width)).astype(np.uint64) if width > 1 else rng.integers(0, P, n).astype(np.uint64)
        betas[:3] = P - 1
        keys = gen(fn, rng.integers(0, 1 << bits, n), betas)[1]
        w = rng.integers(0, P, (len(offsets), size, c)).astype(np.uint64)
        w[:, :40] = P - 1
        y = fn.eval_grid(keys, size).reshape(n, size, width).astype(object)
        dots = [[int((w[j].astype(object) * y[k, :, o:o + c]).sum() % P) for j, o in enumerate(offsets)] for k in range(n)]
        col = y[:, :, :c].sum(axis=0) % P
        threads = backend.threads()
        for name in backend.available() if tiers == "all" else tiers:
            for t in (1, 2):
                backend.set_threads(t)
                try:
                    with backend.using(name):
                        got = fn.eval_grid_sums(keys, size, w, offsets)
                finally:
                    backend.set_threads(threads)
                assert got[0].tolist() == dots and got[1].tolist() == col.tolist(), (name, t, cmp)
                assert np.array_equal(got[2], y[:, -1].astype(np.uint64)), (name, t, cmp)
    with pytest.raises(ParameterError):
        fn.eval_grid_sums(keys, size, np.full((1, size, c), P, np.uint64), [0])
    with pytest.raises(ParameterError):
        fn.eval_grid_sums(keys, size, w[:1], [width])


@pytest.mark.parametrize("width, c, offsets", [(2, 1, (0, 0, 1)), (4, 2, (0, 0, 2)), (1, 1, (0,)), (6, 3, (0, 0, 0, 2, 3, 3)),
                                               (3, 1, (0, 1, 2))])
def test_the_lane_sketch_holds_at_its_bounds(width, c, offsets):
    """`_linear.lane_sketch` (the check's sums in 32 x 32-bit lanes, folded every 2 and 4 vectors)
    against Python integers where every product is largest (values and weights p - 1, so a missed
    fold overflows) and on random rows, with 4 and 8 lanes and rows that leave a tail of every length;
    widths 6 and 3 (which divide neither) take one stream per dot, up to the calibration check's six."""
    from numba import njit

    from fss._linear import lane_sketch, lane_streams, lane_weights

    rng = np.random.default_rng(width)
    for lanes in (4, 8):
        sketch = lane_sketch(width, c, offsets, lanes)

        @njit
        def run(rows, wf, dots, col, last):
            for k in range(rows.shape[0]):
                sketch(rows[k], wf, dots[k], col, last[k])

        for size in (1, 31, 64, 200):
            rows = rng.integers(0, P, (3, size * width)).astype(np.uint64)
            rows[0] = P - 1
            w = rng.integers(0, P, (len(offsets), size, c)).astype(np.uint64)
            w[:, : size // 2] = P - 1
            dots, col, last = np.zeros((3, len(offsets)), np.uint64), np.zeros(size * width, np.uint64), np.zeros((3, width), np.uint64)
            run(rows, lane_weights(w, offsets, width, lane_streams(width, c, offsets, lanes)), dots, col, last)
            y = rows.reshape(3, size, width).astype(object)
            want = [[int((w[j].astype(object) * y[k, :, o:o + c]).sum() % P) for j, o in enumerate(offsets)] for k in range(3)]
            assert dots.tolist() == want, (lanes, size)
            assert col.tolist() == y.sum(axis=0).reshape(-1).tolist() and np.array_equal(last, rows[:, -width:]), (lanes, size)


def test_eval_grid_sums_refuses_bad_arguments_and_folds_wide_rows():
    """Every bad weight or offset is a ParameterError before any kernel runs (an offset near 2^63 wrapped
    past an int64 range check and read before the row; floats were truncated), and the portable path's
    accumulator folds every 32 products however wide the rows (c = 65 overflowed it)."""
    fn = DCF(4, width=2, group="p61", cmp="ge")
    k0, _ = gen(fn, [0, 1, 2], np.ones((3, 2), np.uint64))
    ones = np.ones((1, 5, 1), np.uint64)
    for weights, offsets in ((ones, [2**63 - 1]), (ones, [2]), (ones, [-1]), (ones, [0.7]), (ones, ["a"]), (ones, None),
                             (np.full((1, 5, 1), 0.5), [0]), (np.full((1, 5, 1), -1), [0]), (None, [0]),
                             (np.full((1, 5, 1), P, np.uint64), [0]), (np.full((1, 5, 1), 2**64 - 1, np.uint64), [0]),
                             ([[["x"]] * 5], [0]), (np.ones((1, 4, 1), np.uint64), [0]), (np.ones((1, 5, 3), np.uint64), [0]),
                             (np.ones((2, 5, 1), np.uint64), [0])):
        with pytest.raises(ParameterError):
            fn.eval_grid_sums(k0, 5, weights, offsets)
    wide = DCF(3, width=70, group="p61", cmp="ge")  # above the fused kernels' widths: the portable path
    for keys in gen(wide, [0, 3, 5, 7], np.full((4, 70), P - 1, np.uint64)):
        w = np.full((1, 8, 65), P - 1, np.uint64)
        y = wide.eval_grid(keys, 8).astype(object)
        want = [int((w[0].astype(object) * y[k, :, :65]).sum() % P) for k in range(4)]
        assert wide.eval_grid_sums(keys, 8, w, [0])[0][:, 0].tolist() == want


def test_eval_grid_sums_falls_back_when_its_kernel_fails_the_self_test(monkeypatch):
    """A fused sketch that disagrees with the portable sums is not trusted: a warning and the portable
    path under "auto", an FssError for a tier chosen by name."""
    from fss import FssError, _gridsums

    fn = DCF(6, width=2, group="p61", cmp="ge")
    k0, _ = gen(fn, [1, 40, 63], np.ones((3, 2), np.uint64))
    w = np.full((1, 64, 1), 5, np.uint64)
    with backend.using("portable"):
        want = fn.eval_grid_sums(k0, 64, w, [0])
    monkeypatch.setattr(_gridsums, "eval_grid_sums", lambda batch, *a, **k: tuple(np.zeros_like(x) for x in want))
    backend._sums_self_test.cache_clear()
    try:
        if FASTEST != "portable":
            with backend.using("auto"), pytest.warns(RuntimeWarning, match="self-test"):  # also under FSS_BACKEND=<tier>
                got = fn.eval_grid_sums(k0, 64, w, [0])
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
            with backend.using(FASTEST), pytest.raises(FssError, match="self-test"):
                fn.eval_grid_sums(k0, 64, w, [0])
    finally:
        backend._sums_self_test.cache_clear()


def test_empty_batch_and_one_key():
    fn = DCF(6, group="p61", cmp="ge")
    k0, _ = fn.gen_batch([5, 9], 1)
    empty = k0.select(np.arange(0))
    assert fn.eval_grid(empty, 64).shape == (0, 64)
    assert DCF(6, width=2).eval_grid(DCF(6, width=2).gen_batch([1], 1)[0].select(np.arange(0)), 3).shape == (0, 3, 2)


def test_errors():
    fn = DCF(8, group="p61", cmp="ge")
    k0, _ = fn.gen_batch([3, 4], 1)
    for bad in (0, -1, 257, 1 << 70):
        with pytest.raises(ParameterError, match="size"):
            fn.eval_grid(k0, bad)
    for bad in (True, 2.0, "16", None):
        with pytest.raises(ParameterError, match="size"):
            fn.eval_grid(k0, bad)
    with pytest.raises(KeyMismatchError):
        DCF(8, cmp="ge").eval_grid(k0, 4)  # the ring, not F_p
    with pytest.raises(KeyMismatchError):
        DCF(8, group="p61", cmp="gt").eval_grid(k0, 4)
    with pytest.raises(KeyMismatchError):
        DPF(8, group="p61").eval_grid(k0, 4)
    with pytest.raises(ParameterError, match="KeyBatch"):
        fn.eval_grid(k0[0], 4)
    assert isinstance(k0[0], Key) and isinstance(k0, KeyBatch)
    assert fn.eval_grid(k0, 256).shape == (2, 256)
