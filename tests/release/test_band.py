"""Release.confidence_band: simultaneous coverage of the data's ECDF at the stated level (statistical
tests sized to a few seconds, each with a 3-sigma allowance), a band made for the wrong epsilon
under-covers, two-server releases (two noises per value), the population target, the noise laws of
the calibration, errors and the plot hook."""
import math
import secrets

import numpy as np
import pytest

import dpcdf
from dpcdf import Grid, ParameterError
from dpcdf.release import band
from dpcdf.release.ecdf import finish_release
from dpcdf.release.noise import dlaplace_variance, prf_noise
from dpcdf.release.zcdp import GaussianVariance, dgauss_pmf, dgauss_variance
from helpers import adaptive_v5

LEVEL = 0.95


def data(n=400, size=64, seed=0):
    rng = np.random.default_rng(seed)  # the data set, not privacy noise
    return np.minimum(rng.exponential(size / 5, n).astype(np.int64), size - 1)


def floor(runs: int, level: float = LEVEL) -> float:
    """The lowest coverage a correct band shows in `runs` releases but with probability ~0.1%."""
    return level - 3 * math.sqrt(level * (1 - level) / runs)


def exact_floor(runs: int, level: float = LEVEL, alpha: float = 1e-4) -> float:
    """The lowest coverage a band of exactly `level` shows in `runs` releases but with probability at most
    alpha (the binomial's own tail, not a normal approximation): for bands with no slack (an adaptive
    histogram's, whose coverage is the level itself: 95.2% in 1,000 releases of the flat case below),
    where `floor`'s 3 sds fail a correct band about once in 250 runs of 100 releases."""
    tail, k = 0.0, 0
    while True:
        term = math.comb(runs, k) * level**k * (1 - level) ** (runs - k)
        if tail + term > alpha:
            return k / runs
        tail, k = tail + term, k + 1


def covered(rel, truth, level=LEVEL, target="sample") -> bool:
    lo, hi = rel.confidence_band(level, target)
    return bool(np.all((lo <= truth + 1e-12) & (truth <= hi + 1e-12)))


@pytest.mark.parametrize("mechanism,relation", [("path", "substitution"), ("tree", "substitution"),
                                                ("path", "add-remove"), ("tree", "add-remove")])
def test_the_band_covers_the_sample_ecdf_at_every_threshold(mechanism, relation):
    values, grid, runs = data(), Grid.integers(64), 200
    truth = dpcdf.prefix_counts(values, grid) / values.size
    hits = sum(covered(dpcdf.release_ecdf(values, grid, 1.0, mechanism, relation), truth) for _ in range(runs))
    assert hits / runs >= floor(runs)


def test_the_calibration_is_exact_not_only_conservative():
    """Before the monotone envelope (which only adds coverage), the path release's studentised
    maximum error exceeds the calibration's exact-rank q (no margin) in 5% of releases, within 3
    sigma either way (the fixed draws add an sd of about 0.005)."""
    values, grid, runs = data(), Grid.integers(64), 300
    truth = dpcdf.prefix_counts(values, grid)
    over = 0
    for _ in range(runs):
        est = band.linear_estimate(dpcdf.release_ecdf(values, grid, 1.0, "path"))
        s, maxima = band.calibration(est)
        over += np.max(np.abs(est.y - truth) / s) > band.rank_quantile(maxima, LEVEL, margin=0)
    sigma = math.sqrt(0.05 * 0.95 / runs)
    assert abs(over / runs - 0.05) <= 3 * sigma


def test_a_band_made_for_the_wrong_epsilon_under_covers():
    """The band is only as good as its noise law: computed as if epsilon were 4 times larger (a
    quarter of the noise scale), it misses the ECDF in most releases."""
    from dataclasses import replace

    values, grid, runs = data(), Grid.integers(64), 60
    truth = dpcdf.prefix_counts(values, grid) / values.size
    right = wrong = 0
    for _ in range(runs):
        rel = dpcdf.release_ecdf(values, grid, 1.0, "path")
        right += covered(rel, truth)
        wrong += covered(replace(rel, mechanism=dpcdf.PathMechanism(64, 4.0)), truth)
    assert wrong / runs < 0.5 < floor(runs) <= right / runs


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_adaptive_releases_are_covered_whichever_design_round_one_picks(relation):
    """Flat data (a histogram of equal-width bins) under substitution, skewed data (bins at equal mass,
    or the tree) under add/remove."""
    rng = np.random.default_rng(2)
    grid, runs = Grid.integers(256), 400  # a band of 95% fails below 362 of 400 with probability 1e-4; 90% in 59%
    flat = relation == "substitution"
    values = rng.integers(0, 256, 2000) if flat else np.minimum(rng.exponential(10, 2000).astype(np.int64), 255)
    truth = dpcdf.prefix_counts(values, grid) / values.size
    rels = [dpcdf.release_ecdf(values, grid, 1.0, adaptive_v5(256, 1.0, relation), relation) for _ in range(runs)]
    if flat:
        assert all(r.released.plan.design == "bins" for r in rels)
    assert sum(covered(r, truth) for r in rels) / runs >= exact_floor(runs)


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_releases_whose_spikes_are_split_groups_are_covered(relation):
    """Plan version 3: three narrow spikes, each a split group (its bins fitted to its counted total); the
    band is that fit's (`AdaptiveMechanism.fit` on the noises alone) and covers at the level."""
    rng = np.random.default_rng(4)  # the data set, not privacy noise
    grid, runs = Grid.integers(4096), 200
    values = np.clip(np.rint(rng.normal(rng.choice([300, 1800, 2600], 3000), 2.0)), 0, 4095).astype(np.int64)
    truth = dpcdf.prefix_counts(values, grid) / values.size
    rels = [dpcdf.release_ecdf(values, grid, 1.0, adaptive_v5(4096, 1.0, relation), relation) for _ in range(runs)]
    grouped = [r for r in rels if r.released.plan.design == "bins" and r.released.plan.groups]
    assert len(grouped) > 0.9 * runs and all(r.released.groups is not None for r in grouped)
    assert sum(covered(r, truth) for r in grouped) / len(grouped) >= exact_floor(len(grouped))


def test_an_add_remove_histogram_band_uses_round_twos_count_of_n():
    """Under add/remove at eps 1 round two also counts the whole grid (share rule 2): the band is
    centred on the least-squares fit of the bins and that count, whose error sd at the grid's end is
    sqrt(K v v_n / (K v + v_n)), not the bins' sum's sqrt(K v) (1.2x or more here), and it covers."""
    rng = np.random.default_rng(3)
    grid, runs = Grid.integers(256), 100
    values = rng.integers(0, 256, 2000)  # flat: round one plans a histogram
    truth = dpcdf.prefix_counts(values, grid) / values.size
    rels = [dpcdf.release_ecdf(values, grid, 1.0, adaptive_v5(256, 1.0, "add-remove"), "add-remove") for _ in range(runs)]
    hists = [r for r in rels if r.released.plan.design == "bins"]
    assert len(hists) > runs / 2 and all(r.released.root is not None for r in hists)
    mech, k = hists[0].mechanism, len(hists[0].released.plan.ends)
    v, v_n = dlaplace_variance(mech.scale_two), dlaplace_variance(mech.scale_root)
    sd = band.calibration(band.linear_estimate(hists[0]))[0][-1]  # from 400 pilot draws: ~5% off at most
    assert abs(sd / math.sqrt(k * v * v_n / (k * v + v_n)) - 1) < 0.12 < math.sqrt((k * v + v_n) / v_n) - 1
    assert sum(covered(r, truth) for r in rels) / runs >= floor(runs)


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_plan_version_6_trees_are_covered_with_the_earlier_rounds_counts(relation):
    """Plan version 6 ends in a tree that reuses the counts of the rounds before it (`merge`): on large
    data the whole tree (with round zero's count under add/remove), on two point masses of 400 values
    each (below the route's n, but no wide histogram may interpolate across them) mostly the round-two
    tree (with round one's bins). The band is that merged estimate's and covers at the level."""
    rng = np.random.default_rng(5)  # the data set, not privacy noise
    grid, runs = Grid.integers(1024), 150
    for n, design in ((60_000, "whole"), (800, "tree")):
        values = np.repeat([300, 700], n // 2) if design == "tree" else rng.integers(0, 1024, n)
        truth = dpcdf.prefix_counts(values, grid) / n
        mech = dpcdf.AdaptiveMechanism(1024, 1.0, relation, plan_version=8)
        rels = [dpcdf.release_ecdf(values, grid, 1.0, mech, relation) for _ in range(runs)]
        ours = [r for r in rels if r.released.plan.design == design]
        assert len(ours) > 0.5 * runs, (design, {r.released.plan.design for r in rels})  # (61% tree: 0.6 was flaky)
        assert "earlier rounds' counts" in band.linear_estimate(ours[0]).what or (design, relation) == ("whole", "substitution")
        assert sum(covered(r, truth) for r in ours) / len(ours) >= exact_floor(len(ours)), design


def test_zcdp_releases_are_covered():
    values, grid, runs = data(), Grid.integers(64), 60
    truth = dpcdf.prefix_counts(values, grid) / values.size
    for mechanism in ("factorization", "tree"):
        rels = [dpcdf.release_ecdf(values, grid, privacy="zcdp", rho=0.5, mechanism=mechanism) for _ in range(runs)]
        assert sum(covered(r, truth) for r in rels) / runs >= floor(runs), mechanism


def _two_servers(mech, prefix, n):
    """A release as `Analyst.releases` makes it: each value carries both servers' PRF noise (copies=2)."""
    keys = [secrets.token_bytes(16), secrets.token_bytes(16)]
    noise = lambda ids, scale: prf_noise(keys[0], ids, scale) + prf_noise(keys[1], ids, scale)  # noqa: E731
    released = mech.noisy(prefix, noise, copies=2) if isinstance(mech, dpcdf.AdaptiveMechanism) else mech.noisy(prefix, noise)
    return finish_release(Grid.integers(mech.size), mech, released, n, copies=2)


@pytest.mark.parametrize("mech", [dpcdf.TreeMechanism(64, 1.0), dpcdf.PathMechanism(64, 1.0, "add-remove")])
def test_two_server_releases_account_for_both_noises(mech):
    values, runs = data(), 150
    truth = dpcdf.prefix_counts(values, Grid.integers(64))
    rels = [_two_servers(mech, truth, values.size) for _ in range(runs)]
    assert sum(covered(r, truth / values.size) for r in rels) / runs >= floor(runs)
    one = dpcdf.release_ecdf(values, Grid.integers(64), 1.0, mech, mech.relation)
    sd = lambda r: band.calibration(band.linear_estimate(r))[0]  # noqa: E731  (each threshold's error sd)
    live = sd(one) > 0
    assert rels[0].copies == 2 and abs(np.median(sd(rels[0])[live] / sd(one)[live]) - math.sqrt(2)) < 0.1


def test_the_population_band_adds_dkw_and_covers_the_population_cdf():
    grid, runs, n = Grid.integers(64), 150, 300
    p = np.exp(-np.arange(64) / 12.0)
    p /= p.sum()
    cdf = np.cumsum(p)
    rng = np.random.default_rng(5)  # samples of the population (data, not privacy noise)
    hits = 0
    for _ in range(runs):
        rel = dpcdf.release_ecdf(rng.choice(64, n, p=p), grid, 1.0, "tree")
        hits += covered(rel, np.minimum(cdf, 1.0), target="population")
    assert hits / runs >= floor(runs)
    lo_s, hi_s = rel.confidence_band(LEVEL)
    lo_p, hi_p = rel.confidence_band(LEVEL, "population")
    dkw = math.sqrt(math.log(2 / 0.025) / (2 * n))
    assert np.all(lo_p <= lo_s) and np.all(hi_p >= hi_s)
    assert np.max(hi_p - hi_s) <= dkw + 0.05 and np.mean(hi_p - lo_p) >= np.mean(hi_s - lo_s) + dkw


def test_band_shape_points_and_monotonicity():
    values, grid = data(), Grid.integers(64)
    rel = dpcdf.release_ecdf(values, grid, 1.0)
    lo, hi = rel.confidence_band()
    assert lo.shape == hi.shape == (64,) and np.all(lo <= hi) and np.all(np.diff(lo) >= 0) and np.all(np.diff(hi) >= 0)
    assert 0 <= lo.min() and hi.max() <= 1 and lo[-1] == hi[-1] == 1.0
    at_lo, at_hi = rel.confidence_band(ts=[-1.0, 3.5, 63])
    assert at_lo[0] == 0.0 and at_lo[1] == lo[3] and at_hi[1] == hi[4] and at_hi[2] == 1.0  # between 3 and 4: both bands
    narrow = rel.confidence_band(0.5)
    assert np.all(narrow[0] >= lo) and np.all(narrow[1] <= hi)


@pytest.mark.parametrize("bad", [dict(level=0), dict(level=1.0), dict(level=True), dict(target="world"),
                                 dict(sims=3)])
def test_bad_arguments_are_refused(bad):
    rel = dpcdf.release_ecdf(data(), Grid.integers(64), 1.0)
    with pytest.raises(ParameterError):
        rel.confidence_band(**bad)


def test_the_calibration_draws_the_mechanisms_noise_laws():
    rng = band._generator()
    for scale in (GaussianVariance(3), GaussianVariance(10**9)):
        x = band.draw_noise(scale, 100_000, rng)
        assert abs(x.var() / dgauss_variance(float(scale)) - 1) < 0.03
    x = band.draw_noise(GaussianVariance(3), 200_000, rng)
    for k in (0, 1, 3):
        assert abs(np.mean(x == k) - dgauss_pmf(3.0, np.array([k]))[0]) < 0.005
    from fractions import Fraction

    for t in (Fraction(1, 2), Fraction(20)):
        x = band.draw_noise(t, 100_000, rng, copies=2)
        assert abs(x.var() / (2 * dlaplace_variance(t)) - 1) < 0.03
    q = math.exp(-1 / 0.5)
    assert abs(np.mean(band.draw_noise(Fraction(1, 2), 100_000, rng) == 0) - (1 - q) / (1 + q)) < 0.005


def test_rank_quantile():
    m = np.arange(1.0, 20.0)  # 19 draws: the 19th is the 95% rank, beyond it there is none
    assert band.rank_quantile(m, 0.95, margin=0) == 19.0 and band.rank_quantile(m, 0.96, margin=0) == math.inf
    assert band.rank_quantile(m, 0.5, margin=0) == 10.0
    # the default margin: 2 binomial sds above (m + 1) level, 1,921 of 2,000 at 0.95
    assert band.rank_quantile(np.arange(1.0, 2001.0), 0.95) == 1921.0


def test_the_same_release_gets_the_same_band():
    """The calibration is seeded from the mechanism's public parameters: asked twice (in two
    processes, or after the cache is cleared), a release's band is the same."""
    rel = dpcdf.release_ecdf(data(), Grid.integers(64), 1.0, "tree")
    first = rel.confidence_band()
    band._CACHE.clear()
    again = rel.confidence_band()
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])


def test_plot_draws_the_band():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rel = dpcdf.release_ecdf(data(), Grid.integers(64), 1.0)
    ax = rel.plot()
    assert len(ax.collections) == 1 and len(ax.lines) == 1
    assert len(rel.plot(band=None).collections) == 0
    plt.close("all")


def test_the_analysts_two_server_release_is_covered():
    """The Release `Analyst.release()` returns (in process: the analyst's questions answered by two
    Aggregators over real key shares, each server with its own secret noise seed, as
    tests/service/test_server_app.py drives them) carries copies=2, and its band covers."""
    import json

    from pydantic import TypeAdapter

    from dpcdf.service.client.analyst import Analyst
    from dpcdf.service.server import answers, models
    from dpcdf.service.server.aggregate import Aggregator
    from dpcdf.service.task import TaskConfig

    config = TaskConfig(grid={"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 6}, epsilon=1.0, mechanism="tree",
                        relation="substitution", min_batch=0, servers=("http://127.0.0.1:9", "http://127.0.0.1:10"),
                        hpke_keys=("00" * 32, "01" * 32), token_hash="00" * 32, payload="count", task_id="band",
                        verify=False)  # answers from the key shares (a verified task's histogram is not made here)
    values = np.random.default_rng(4).beta(2, 5, 300)  # the data set, not privacy noise
    grid, dcf, parse = config.make_grid(), config.dcf(), TypeAdapter(models.Query)
    keys = dcf.gen_batch(grid.index(values), 1)
    truth = dpcdf.prefix_counts(values, grid) / values.size
    runs, hits = 80, 0
    for _ in range(runs):
        aggs = [Aggregator(dcf, config.make_mechanism(), secrets.token_bytes(32), config.task_id) for _ in (0, 1)]

        def ask(question: dict, aggs=aggs):
            q = parse.validate_json(json.dumps(question)).to_query()
            answers.check(q, config, aggs[0])
            shares = [answers.shares(q, config, agg, [k]) for agg, k in zip(aggs, keys)]
            return dcf.reconstruct(shares[0], shares[1], signed=True), values.size

        analyst = Analyst(config, "token")
        analyst._closed, analyst._ask = True, ask
        rel = analyst.release()
        assert rel.copies == 2
        hits += covered(rel, truth)
    assert hits / runs >= floor(runs)


def test_the_band_at_values_between_thresholds_covers_the_datas_ecdf_there():
    """Issue 46: integer data (ages) on a grid whose thresholds are not integers (2^8 over [18, 90],
    spacing 0.28): `ecdf(45)` reads the threshold 44.82 (`read_at`), which leaves out everyone aged 45,
    but the band at 45 spans the bands of the thresholds around it, so it contains the data's F(45):
    at 100 random points at once in at least the level's share of releases; the answer at a
    threshold itself is unchanged."""
    rng = np.random.default_rng(8)  # the data set and the points, not privacy noise
    ages = np.clip(np.rint(rng.normal(45, 12, 5000)), 18, 90)
    grid, runs = Grid.uniform(18, 90, 8), 120
    ts = np.concatenate([[30.0, 45.0, 60.0], rng.uniform(10, 95, 97)])
    truth = np.array([(ages <= t).mean() for t in ts])
    rels = [dpcdf.release_ecdf(ages, grid, 1.0, "tree") for _ in range(runs)]
    assert rels[0].read_at([45.0, grid.thresholds[3], 10.0])[:2].tolist() == [grid.thresholds[95], grid.thresholds[3]]
    assert np.isnan(rels[0].read_at([10.0])[0]) and (ages <= grid.thresholds[95]).mean() < truth[1] - 0.02
    hits = 0
    for rel in rels:
        lo, hi = rel.confidence_band(ts=ts)
        hits += bool(np.all((lo <= truth + 1e-12) & (truth <= hi + 1e-12)))
        on_grid = rel.confidence_band(ts=grid.thresholds[:5])
        np.testing.assert_array_equal(np.stack(on_grid), np.stack(rel.confidence_band())[:, :5])
    assert hits / runs >= floor(runs)


def test_an_integer_grid_answers_at_the_integers():
    """`Grid.integers(lo, hi)`: thresholds lo .. hi, so F(45) counts everyone aged 45 and quantiles are
    integers; bad bounds are typed errors."""
    ages = np.array([18, 30, 45, 45, 45, 60, 90])
    grid = Grid.integers(18, 90)
    assert grid.size == 73 and grid.thresholds[0] == 18 and grid.thresholds[-1] == 90
    rel = dpcdf.release_ecdf(ages, grid, 50.0, "tree")
    assert rel.read_at([45.0])[0] == 45.0 and np.all(rel.quantile([0.1, 0.5, 0.9]) % 1 == 0)
    assert Grid.integers(64).thresholds.tolist() == list(range(64))
    for bad in ((5, 5), (5, 2), (1.5, 9), (True, 9), (0,)):
        with pytest.raises(ParameterError):
            Grid.integers(*bad)


def test_integer_data_on_a_grid_between_integers_is_warned_about():
    """Issue 46: a central release of integer values on a grid some of whose integers are not thresholds
    warns (`IntegerGridWarning`, naming `Grid.integers`); on `Grid.integers(lo, hi)`, or for values that
    are not whole numbers, it does not. The CLI spells that grid `integers:LO:HI` (a task's thresholds)."""
    import warnings

    from dpcdf.cli_inputs import CliError, parse_grid

    ages = np.array([18, 30, 45, 45, 90.0])
    with pytest.warns(dpcdf.IntegerGridWarning, match="Grid.integers"):
        dpcdf.release_ecdf(ages, Grid.uniform(18, 90, 8), 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dpcdf.release_ecdf(ages, Grid.integers(18, 90), 1.0)
        dpcdf.release_ecdf(ages + 0.5, Grid.uniform(18, 91, 8), 1.0)
    assert Grid.uniform(18, 90, 8).shifts_integers(ages) and not Grid.uniform(0, 100, 3).shifts_integers([0.0, 100.0])
    spec = parse_grid("integers:18:90")
    assert spec == {"kind": "thresholds", "values": [float(v) for v in range(18, 91)]}
    for bad in ("integers:5:5", "integers:1.5:9", "integers:3", "integers:0:99999999"):
        with pytest.raises(CliError, match="grid"):
            parse_grid(bad)


def test_plan_version_8_screened_substitution_releases_are_covered():
    """Version 8 under substitution: one point mass of 1,000 values on 2^10 at eps 2 (below the route's n,
    1,010) is screened by round zero's fine counts in most releases, which then take the whole tree with
    those counts merged; the band is the merged estimate's and covers at the level."""
    grid, runs = Grid.integers(1024), 120
    values = np.full(1000, 500)  # the data set
    truth = dpcdf.prefix_counts(values, grid) / values.size
    rels = [dpcdf.release_ecdf(values, grid, 2.0, dpcdf.AdaptiveMechanism(1024, 2.0, plan_version=8), "substitution") for _ in range(runs)]
    ours = [r for r in rels if r.released.plan.design == "whole"]
    assert rels[0].mechanism.plan_version == 8 and len(ours) > 0.7 * runs and ours[0].released.zero is not None
    assert "earlier rounds' counts" in band.linear_estimate(ours[0]).what
    assert sum(covered(r, truth) for r in ours) / len(ours) >= exact_floor(len(ours))
