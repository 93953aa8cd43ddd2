"""The report check's MAC (verify.Check with mac=True; protocols.check.exchange has why): the servers'
sigmas add up to 0 for an honest opening, and to kappa times the shift for any other, for every
payload and every opened element; the MAC takes nothing from the sketch's own verdicts."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dpcdf import ParameterError
from dpcdf.service.verification import maths as V, randomness as RND
from fss import DCF
from fss import field as F

SIZE, BITS = 8, 3
ALPHAS = np.array([0, 3, 7, 2, 5])


def betas_for(payload: str) -> np.ndarray:
    labels = np.array([0, 1, 1, 0, 1])
    if payload == "count":
        return np.ones((5, 1), np.int64)
    if payload == "label":
        return np.stack([labels, 1 - labels], axis=1)
    return np.stack([np.ones(5, np.int64), labels, np.array([0, 5, 65536, 300, 7])], axis=1)


def two_servers(payload: str, version: int = 2):
    """Both servers' round one of five honest reports (keys of F_p key format `version`), and their extras."""
    check = V.Check(payload, SIZE, mac=True)
    key_betas, x0, x1 = check.client_report(betas_for(payload))
    dcf = DCF(BITS, width=check.key_width, cmp="ge", group="p61", version=version)
    k0, k1 = dcf.gen_batch(ALPHAS, key_betas)
    ch = check.challenges(b"k" * 32, b"mac test")
    ys = [np.ascontiguousarray(dcf.eval_grid(k, SIZE).reshape(5, SIZE, check.key_width)) for k in (k0, k1)]
    (m0, s0), (m1, s1) = check.round_one(0, ys[0], x0, ch), check.round_one(1, ys[1], x1, ch)
    return check, (s0, s1), (x0, x1), F.add(m0, m1), ys


def sigmas(check, states, extras, opened):
    return [check.mac_values(b, states[b], opened, extras[b]) for b in (0, 1)]


@settings(max_examples=30, deadline=None)
@given(payload=st.sampled_from(V.CHECKED), column=st.integers(0, RND.CALIBRATION_OPENED - 1),
       shift=st.integers(1, RND.P - 1), row=st.integers(0, 4))
def test_an_honest_opening_passes_and_any_shift_of_any_element_fails(payload, column, shift, row):
    check, states, extras, opened, _ = two_servers(payload)
    assert V.mac_ok(*sigmas(check, states, extras, opened)).all()
    v = F.add(check.round_two(0, states[0], opened, extras[0]), check.round_two(1, states[1], opened, extras[1]))
    assert (check.verdicts(opened, v, V.mac_ok(*sigmas(check, states, extras, opened))) == V.OK).all()
    moved = opened.copy()
    moved[row, column % check.opened] = F.add(moved[row, column % check.opened], np.array([shift], np.uint64))[0]
    ok = V.mac_ok(*sigmas(check, states, extras, moved))
    assert not ok[row] and ok.sum() == 4
    assert check.verdicts(moved, v, ok)[row] == V.MAC


@pytest.mark.parametrize("payload", V.CHECKED)
def test_keys_of_the_first_prime_format_pass_and_fail_as_the_default_ones(payload):
    """A task made before key format 2 keeps version 1 (`TaskConfig.key_format`): its honest reports
    pass the whole check and a shifted opening fails it, as with version 2's keys."""
    for version in (1, 2):
        check, states, extras, opened, _ = two_servers(payload, version)
        ok = V.mac_ok(*sigmas(check, states, extras, opened))
        v = F.add(check.round_two(0, states[0], opened, extras[0]), check.round_two(1, states[1], opened, extras[1]))
        assert ok.all() and (check.verdicts(opened, v, ok) == V.OK).all(), version
        moved = opened.copy()
        moved[2, 0] = F.add(moved[2, 0:1], np.array([1], np.uint64))[0]
        assert V.mac_ok(*sigmas(check, states, extras, moved)).tolist() == [True, True, False, True, True], version


def test_the_mac_tags_are_kappa_times_the_values_on_the_grid():
    """The keys carry (beta, kappa beta): the tag columns reconstruct to one kappa per report times the values."""
    for payload in V.CHECKED:
        check, _, extras, _, ys = two_servers(payload)
        y = F.add(ys[0], ys[1])
        kappa = F.add(extras[0][:, -1], extras[1][:, -1])
        w = check.width
        assert np.array_equal(y[:, :, w:], F.mul(y[:, :, :w], np.broadcast_to(kappa[:, None, None], y[:, :, :w].shape)))
        assert check.extras == 2 * check.base_extras + 1 and check.key_width == 2 * w


def test_without_a_mac_the_check_is_the_sketch_alone():
    check = V.Check("count", SIZE)
    assert (check.extras, check.key_width) == (2, 1)
    x0, x1 = check.client_extras(np.ones((3, 1), np.int64))
    beta, y0, y1 = check.client_report(np.ones((3, 1), np.int64))
    assert beta.shape == (3, 1) and y0.shape == x0.shape == (3, 2)


def _two_sketches(check, party, y, extras, ch):
    """Check.round_one with the MAC as it was before the fused kernel: `sketch.sketch` run on a copy of
    the values and on a copy of the tags (the message, state and MAC bits every server must keep)."""
    from dpcdf.service.verification import sketch

    w, xs = check.width, check.base_extras

    def one(b, yy, ex):
        z, big_l, top = sketch.sketch(np.ascontiguousarray(yy), ch.wz, ch.wl, np.uint64(1 if b == 0 else 0))
        return np.stack([F.sub(z, ex[:, 0]), top], axis=1), np.stack([big_l, F.mul(top, np.full_like(top, ch.s))], axis=1)

    msg, state = one(party, y[:, :, :w], extras[:, :xs])
    linear, _ = one(1, y[:, :, w:], extras[:, xs:2 * xs])
    tagged = F.add(linear, F.mul(extras[:, 2 * xs][:, None], check._constant(ch)[None, :]))
    return msg, np.column_stack([state, tagged])


@settings(max_examples=20, deadline=None)
@given(payload=st.sampled_from(["count", "label"]), size=st.sampled_from([1, 2, 15, 16, 17, 33, 64]),
       seed=st.integers(0, 2**32 - 1), party=st.integers(0, 1))
def test_the_fused_round_one_gives_the_bits_of_two_sketches(payload, size, seed, party):
    """One pass over values and tags in place (`sketch.sketch_mac`) sends and keeps exactly what two
    `sketch` runs over copies did, on any grid values (honest or not, edge elements included), and
    `round_one_sums` adds the column sums of the values (`column_sums` of `round_one.data`)."""
    from dpcdf.service.protocols.check import round_one
    from dpcdf.service.verification import sketch

    check = V.Check(payload, size, mac=True)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, RND.P, (7, size, check.key_width), dtype=np.uint64)
    y[0], y[1] = RND.P - 1, 0
    y[2] = rng.choice(np.array([0, 1, RND.P - 1], np.uint64), y[2].shape)
    x = rng.integers(0, RND.P, (7, check.extras), dtype=np.uint64)
    ch = check.challenges(rng.bytes(32), b"fused")
    msg, state = _two_sketches(check, party, y, x, ch)
    m1, s1 = check.round_one(party, y, x, ch)
    m2, s2, sums = check.round_one_sums(party, y, x, ch)
    for a, b in ((m1, msg), (s1, state), (m2, msg), (s2, state)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    np.testing.assert_array_equal(sums, sketch.column_sums(round_one.data(check, y)))


def test_round_one_sums_of_calibration_and_of_a_check_without_mac():
    """The other checks' round_one_sums: their round_one and the values' column sums."""
    from dpcdf.service.protocols.check import round_one
    from dpcdf.service.verification import sketch

    rng = np.random.default_rng(3)
    for check in (V.Check("calibration", 9, mac=True), V.Check("count", 9), V.Check("label", 9)):
        y = rng.integers(0, RND.P, (5, 9, check.key_width), dtype=np.uint64)
        x = rng.integers(0, RND.P, (5, check.extras), dtype=np.uint64)
        ch = check.challenges(b"k" * 32, b"sums")
        m, s, sums = check.round_one_sums(1, y, x, ch)
        m1, s1 = check.round_one(1, y, x, ch)
        assert np.array_equal(m, m1) and np.array_equal(s, s1)
        np.testing.assert_array_equal(sums, sketch.column_sums(round_one.data(check, y)))


def test_a_pass_from_the_keys_gives_the_bits_of_round_one_sums():
    """`round_one.pass_sums` (the MAC'd count and label checks from `DCF.eval_grid_sums`, each key's grid
    values reduced in cache; the others through the grid values) equals `round_one_sums` on
    `grid_values`, for both servers, on the portable and the fastest backend (`eval_grid_sums` is pinned
    on every backend in test_eval_grid)."""
    from dpcdf.service.protocols.check import round_one
    from fss import backend

    rng = np.random.default_rng(4)
    for payload in V.CHECKED:
        for check in (V.Check(payload, 50, mac=True), V.Check(payload, 50)):
            dcf = DCF(6, width=check.key_width, cmp="ge", group="p61")
            key_betas, x0, x1 = check.client_report(betas_for(payload)[[0, 1, 2, 3, 4] * 4])
            keys = dcf.gen_batch(rng.integers(0, 50, 20), key_betas)
            ch = check.challenges(b"k" * 32, b"pass")
            for name in sorted({"portable", backend.available()[-1]}):
                with backend.using(name):
                    for party, (k, x) in enumerate(zip(keys, (x0, x1))):
                        want = check.round_one_sums(party, round_one.grid_values(dcf, k, 50), x, ch)
                        got = round_one.pass_sums(dcf, check, party, k, x, ch)
                        for a, b in zip(want, got):
                            assert a.dtype == b.dtype and np.array_equal(a, b), (payload, check.mac, name, party)


def test_a_pass_refuses_keys_of_another_width():
    """As `round_one_sums` refuses grid values of another width, `pass_sums` refuses keys of one (it
    would otherwise sum the wrong columns)."""
    from dpcdf.service.protocols.check import round_one

    check = V.Check("count", 8, mac=True)
    dcf = DCF(3, width=4, cmp="ge", group="p61")
    keys, _ = dcf.gen_batch(np.arange(3), np.ones((3, 4), np.int64))
    with pytest.raises(ParameterError, match="width"):
        round_one.pass_sums(dcf, check, 0, keys, np.zeros((3, check.extras), np.uint64), check.challenges(b"k" * 32, b"w"))
