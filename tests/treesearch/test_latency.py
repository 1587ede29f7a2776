"""LatencyModel: exact recovery of a known model, interpolation, JSON, and rejected inputs."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entmtp.core import EntmtpError
from entmtp.treesearch._latency import DECODER_OVERHEAD, NOISE_SIGMAS, LatencyModel, LatencyPoint
from entmtp.treesearch._tree import Tree


def reference_step_ms(knots, values, depth_ms, n, d) -> float:
    """Piecewise linear through (knots, values), extended linearly past the last (flat if the
    last segment falls), plus depth."""
    for i in range(1, len(knots)):
        x0, y0, x1, y1 = knots[i - 1], values[i - 1], knots[i], values[i]
        if n <= x1:
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0) + depth_ms * d
        if x1 == knots[-1]:
            return y1 + max(y1 - y0, 0.0) * (n - x1) / (x1 - x0) + depth_ms * d
    return values[0] + depth_ms * d


@st.composite
def known_models(draw):
    knots = sorted(draw(st.sets(st.integers(1, 200), min_size=1, max_size=6)))
    knots = [0, *knots]
    values = [draw(st.floats(1.0, 500.0)) for _ in knots]
    depth_ms = draw(st.one_of(st.just(0.0), st.floats(0.01, 20.0)))
    return knots, values, depth_ms


@settings(max_examples=60, deadline=None)
@given(model=known_models())
def test_from_measurements_recovers_known_model(model) -> None:
    knots, values, depth_ms = model
    rows = [(n, d, v + depth_ms * d) for n, v in zip(knots, values, strict=True)
            for d in (1, 2, 4)]
    fitted = LatencyModel.from_measurements(rows, autoregressive_ms=7.5)
    assert fitted.nodes == tuple(knots)
    np.testing.assert_allclose(fitted.verify_ms, values, rtol=1e-9, atol=1e-9)
    assert fitted.depth_ms == pytest.approx(depth_ms, abs=1e-9)
    assert fitted.autoregressive_ms == 7.5
    for n in range(0, knots[-1] + 30, 7):
        for d in (0, 3):
            assert fitted.step_ms(n, d) == pytest.approx(
                reference_step_ms(knots, values, depth_ms, n, d), rel=1e-9, abs=1e-9
            )


def test_step_ms_vectorizes_and_scores_trees() -> None:
    model = LatencyModel(nodes=(0, 10, 20), verify_ms=(5.0, 10.0, 30.0), autoregressive_ms=4.0,
                         depth_ms=0.5)
    n = np.array([0, 5, 10, 15, 20, 30])
    d = np.array([0, 1, 2, 3, 4, 5])
    np.testing.assert_allclose(model.step_ms(n, d), [5.0, 8.0, 11.0, 21.5, 32.0, 52.5])
    assert isinstance(model.step_ms(3, 1), float)
    tree = Tree.from_paths([[0], [1], [0, 0]])
    assert model.tree_ms(tree) == pytest.approx(5.0 + 0.5 * 3 + 0.5 * 2)


def test_missing_zero_knot_is_extended_flat() -> None:
    fitted = LatencyModel.from_measurements([(4, 1, 10.0), (8, 1, 14.0)], autoregressive_ms=3.0)
    assert fitted.nodes == (0, 4, 8)
    assert fitted.step_ms(0, 1) == pytest.approx(10.0)


def test_a_negative_depth_fit_falls_back_to_no_depth_term() -> None:
    rows = [(4, 1, 12.0), (4, 3, 10.0), (8, 1, 20.0), (8, 3, 18.0)]
    fitted = LatencyModel.from_measurements(rows, autoregressive_ms=3.0)
    assert fitted.depth_ms == 0.0
    np.testing.assert_allclose(fitted.verify_ms, [11.0, 11.0, 19.0])


@settings(max_examples=30, deadline=None)
@given(model=known_models())
def test_json_round_trip(model, tmp_path_factory) -> None:
    knots, values, depth_ms = model
    latency = LatencyModel.from_measurements(
        [(n, d, v + depth_ms * d) for n, v in zip(knots, values, strict=True) for d in (1, 2)],
        autoregressive_ms=2.0,
        prepare_ms=0.75,
        hardware={"kind": "test", "threads": 2},
    )
    assert LatencyModel.from_json(json.loads(json.dumps(latency.to_json()))) == latency
    without = latency.to_json()
    del without["prepare_ms"]  # optional: absent means no preparation cost
    assert LatencyModel.from_json(without).prepare_ms == 0.0
    assert latency.fused_empty_ms is None and "fused_empty_ms" not in latency.to_json()
    fused = dataclasses.replace(latency, fused_empty_ms=1.5)
    assert fused.to_json()["fused_empty_ms"] == 1.5
    assert LatencyModel.from_json(json.loads(json.dumps(fused.to_json()))) == fused
    assert LatencyModel.from_json({**fused.to_json(), "fused_empty_ms": None}) == latency
    path = tmp_path_factory.mktemp("latency") / "latency.json"
    assert LatencyModel.load(latency.save(path)) == latency
    per_depth = dataclasses.replace(fused, prepare_ms_by_depth=(0.25, 0.5, 0.75),
                                    fused_empty_ms_by_depth=(1.0, 1.25, 1.5))
    assert per_depth.to_json()["prepare_ms_by_depth"] == [0.25, 0.5, 0.75]
    assert LatencyModel.from_json(json.loads(json.dumps(per_depth.to_json()))) == per_depth
    assert "prepare_ms_by_depth" not in fused.to_json()  # absent: one value for every depth
    # with the lists the file holds them alone; the scalars are their last entries
    assert not {"prepare_ms", "fused_empty_ms"} & set(per_depth.to_json())
    lists_only = LatencyModel.from_json(per_depth.to_json())
    assert (lists_only.prepare_ms, lists_only.fused_empty_ms) == (0.75, 1.5)
    for scalar, value in (("prepare_ms", 0.75), ("fused_empty_ms", 1.5)):
        with pytest.raises(EntmtpError, match=f"both {scalar} and {scalar}_by_depth"):
            LatencyModel.from_json({**per_depth.to_json(), scalar: value})


@pytest.mark.parametrize("seed", range(5))
def test_head_row_ms_is_the_least_squares_slope_of_the_per_depth_figures(seed) -> None:
    rng = np.random.default_rng(seed)
    plain = LatencyModel((0, 4), (10.0, 20.0), autoregressive_ms=9.0)
    assert plain.head_row_ms == 0.0  # no per-depth figures (Hydra)
    for count in (2, 3, 4):
        figures = tuple(float(v) for v in 10.0 + rng.uniform(-1.0, 2.0, count).cumsum())
        slope = float(np.polyfit(np.arange(1, count + 1), figures, 1)[0])
        timed = dataclasses.replace(plain, prepare_ms_by_depth=figures,
                                    fused_empty_ms_by_depth=tuple(f + 9.0 for f in figures[::-1]))
        assert timed.head_row_ms == pytest.approx(max(slope, 0.0), abs=1e-12)
        untimed = dataclasses.replace(plain, prepare_ms_by_depth=(0.0,) * count,
                                      fused_empty_ms_by_depth=figures)
        assert untimed.head_row_ms == pytest.approx(max(slope, 0.0), abs=1e-12)
    one_depth = dataclasses.replace(plain, fused_empty_ms_by_depth=(12.0,))
    assert one_depth.head_row_ms == 0.0
    falling = dataclasses.replace(plain, fused_empty_ms_by_depth=(13.0, 12.0, 11.0))
    assert falling.head_row_ms == 0.0


def test_entropy_readout_is_the_static_engines_empty_step_over_its_plain_step() -> None:
    model = LatencyModel((0, 4), (10.5, 20.0), autoregressive_ms=10.0,
                         hardware={"engine": "static"})
    assert model.entropy_readout_ms == 0.5
    noisy = dataclasses.replace(model, verify_ms=(9.5, 20.0))  # cheaper: noise, no saving
    assert noisy.entropy_readout_ms == 0.0
    for hardware in ({}, {"engine": "eager"}):  # the eager empty step pays more than entropy
        assert dataclasses.replace(model, hardware=hardware).entropy_readout_ms == 0.0


def test_per_depth_costs_clamp_to_the_measured_depths_and_fall_back_to_the_scalar() -> None:
    plain = LatencyModel((0, 4), (10.0, 20.0), autoregressive_ms=9.0, prepare_ms=3.0,
                         fused_empty_ms=12.0)
    for depth in range(0, 6):  # no per-depth values: the scalar for every depth
        assert plain.prepare_cost(depth) == 3.0 and plain.fused_empty_cost(depth) == 12.0
    per_depth = dataclasses.replace(plain, prepare_ms_by_depth=(1.0, 2.0, 3.0),
                                    fused_empty_ms_by_depth=(10.5, 11.0, 12.0))
    assert [per_depth.prepare_cost(d) for d in range(0, 6)] == [1.0, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert [per_depth.fused_empty_cost(d) for d in (0, 1, 2, 3, 9)] == [10.5, 10.5, 11.0, 12.0,
                                                                         12.0]
    unfused = LatencyModel((0, 4), (10.0, 20.0), autoregressive_ms=9.0,
                           prepare_ms_by_depth=(1.0, 2.0))
    assert unfused.fused_empty_cost(1) is None and unfused.prepare_cost(2) == 2.0
    assert unfused.prepare_ms == 2.0  # the deepest entry, set from the list
    fused_lists = LatencyModel((0, 4), (10.0, 20.0), autoregressive_ms=9.0,
                               fused_empty_ms_by_depth=(10.5, 11.0))
    assert fused_lists.fused_empty_ms == 11.0 and fused_lists.fused_empty_cost(1) == 10.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nodes": (), "verify_ms": ()},
        {"nodes": (0, 4), "verify_ms": (1.0,)},
        {"nodes": (1, 4), "verify_ms": (1.0, 2.0)},  # must start at 0
        {"nodes": (0, 4, 4), "verify_ms": (1.0, 2.0, 3.0)},  # must ascend strictly
        {"nodes": (0, 4), "verify_ms": (1.0, -2.0)},
        {"nodes": (0, 4), "verify_ms": (1.0, float("nan"))},
        {"nodes": (0, 4), "verify_ms": (1.0, float("inf"))},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "depth_ms": -1.0},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "autoregressive_ms": -1.0},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "prepare_ms": -0.5},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "prepare_ms": float("nan")},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "fused_empty_ms": -1.0},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "fused_empty_ms": float("inf")},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "prepare_ms_by_depth": (1.0, -1.0)},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "prepare_ms_by_depth": (float("nan"),)},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "fused_empty_ms": 2.0,
         "fused_empty_ms_by_depth": (2.0, float("inf"))},
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "prepare_ms": 1.5,
         "prepare_ms_by_depth": (1.0, 2.0)},  # the scalar is the list's last entry
        {"nodes": (0, 4), "verify_ms": (1.0, 2.0), "fused_empty_ms": 2.5,
         "fused_empty_ms_by_depth": (2.0,)},
    ],
)
def test_bad_values_rejected(kwargs) -> None:
    kwargs = {"autoregressive_ms": 1.0, **kwargs}
    with pytest.raises(EntmtpError):
        LatencyModel(**kwargs)


def test_bad_files_and_json_rejected(tmp_path) -> None:
    with pytest.raises(EntmtpError):
        LatencyModel.from_measurements([], autoregressive_ms=1.0)
    with pytest.raises(EntmtpError):
        LatencyModel.from_json({"format": "entmtp-bundle"})
    with pytest.raises(EntmtpError):
        LatencyModel.from_json({"nodes": [0, 1]})
    with pytest.raises(EntmtpError):
        LatencyModel.from_json({"nodes": [0, 1], "verify_ms": ["a", 1], "autoregressive_ms": 1})
    with pytest.raises(EntmtpError):
        LatencyModel.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(EntmtpError):
        LatencyModel.load(bad)


def test_synthetic_presets_are_valid() -> None:
    gpu = LatencyModel.gpu_like()
    assert gpu.step_ms(0, 0) == gpu.step_ms(63, 0)  # flat while the tree fits the slack
    assert gpu.step_ms(128, 0) > gpu.step_ms(63, 0)
    cpu = LatencyModel.cpu_like()
    assert np.all(np.diff(cpu.step_ms(np.arange(0, 200), 0)) >= 0)


def test_bundle_schema_takes_the_optional_fused_empty_ms() -> None:
    from importlib.resources import files

    from jsonschema import Draft202012Validator

    schema = json.loads(files("entmtp.treesearch").joinpath("bundle.schema.json").read_text())
    validator = Draft202012Validator(schema["properties"]["latency"])
    latency = LatencyModel.cpu_like()
    assert validator.is_valid(latency.to_json())
    assert validator.is_valid(dataclasses.replace(latency, fused_empty_ms=80.0).to_json())
    assert not validator.is_valid({**latency.to_json(), "fused_empty_ms": -1.0})
    per_depth = dataclasses.replace(latency, fused_empty_ms=80.0, prepare_ms_by_depth=(1.0, 2.0),
                                    fused_empty_ms_by_depth=(79.0, 80.0))
    assert validator.is_valid(per_depth.to_json())
    assert not validator.is_valid({**per_depth.to_json(), "prepare_ms_by_depth": [-1.0]})
    assert not validator.is_valid({**per_depth.to_json(), "prepare_ms": 2.0})  # list alone
    assert not validator.is_valid({**per_depth.to_json(), "fused_empty_ms": 80.0})


# -- noise and checks ---------------------------------------------------------------------------

def _point(step, ms, iqr, *, nodes=0, depth=0, context=128, rounds=16):
    return LatencyPoint(step=step, context=context, ms=ms, median_ms=ms, iqr_ms=iqr,
                        rounds=rounds, nodes=nodes, depth=depth)


def _noisy_model(*, verify=(50.0, 60.0, 70.0), ar=49.0, fused=None, iqr=2.0, measured=True):
    nodes = (0, 1, 2)
    points = [_point("tree", v, iqr, nodes=n, depth=min(n, 1))
              for n, v in zip(nodes, verify, strict=True)]
    points.append(_point("autoregressive", ar, iqr))
    if fused is not None:
        points.append(_point("fused_empty", fused, iqr, depth=1))
    return LatencyModel(nodes, verify, autoregressive_ms=ar, fused_empty_ms=fused,
                        points=tuple(points) if measured else (),
                        hardware={"kind": "measured"})


def test_a_sane_model_passes_every_check():
    assert _noisy_model(fused=51.0).findings() == []


def test_a_fused_empty_step_cheaper_than_a_plain_one_beyond_noise_fails():
    se = 2.0 / 1.349 / 4.0  # iqr / 1.349 / sqrt(16)
    tolerance = NOISE_SIGMAS * math.hypot(se, se)
    assert _noisy_model(fused=50.0 - 0.9 * tolerance).findings() == []
    (finding,) = _noisy_model(fused=50.0 - 1.1 * tolerance).findings()
    assert "fused empty step" in finding.message
    involved = {(p.step, p.nodes) for p in _noisy_model(fused=1.0).points
                if finding.involves(p)}
    assert involved == {("tree", 0), ("fused_empty", 0)}


def test_the_empty_tree_step_must_sit_near_an_autoregressive_one():
    assert _noisy_model(ar=49.0).findings() == []
    cheap = _noisy_model(verify=(30.0, 60.0, 70.0), ar=49.0).findings()
    assert len(cheap) == 1 and "cheaper than an autoregressive" in cheap[0].message
    # the demo: 69.9 ms against 49.0
    dear = _noisy_model(verify=(69.9, 80.0, 90.0), ar=49.0).findings()
    assert len(dear) == 1 and f"plus {DECODER_OVERHEAD:.0%}" in dear[0].message
    # an overhead inside the allowance passes
    assert _noisy_model(verify=(49.0 * 1.1, 60.0, 70.0), ar=49.0).findings() == []


def test_step_time_may_not_fall_as_the_tree_grows_beyond_noise():
    (finding,) = _noisy_model(verify=(50.0, 396.0, 147.0)).findings()
    assert "falls as the tree grows" in finding.message and finding.nodes == (1, 2)
    assert _noisy_model(verify=(50.0, 60.0, 59.5)).findings() == []  # within noise
    wide = _noisy_model(verify=(50.0, 60.0, 59.5), iqr=0.01).findings()
    assert len(wide) == 1 and "1 -> 2 nodes" in wide[0].message


def test_a_fall_below_a_quiet_smaller_tree_counts_behind_a_noisy_costlier_one():
    """0 nodes 50 ms (quiet), 1 node 60 ms (very noisy), 2 nodes 45 ms (quiet): the fall from
    0 to 2 nodes is beyond noise although the costliest knot, 1 node, is too noisy to show it."""
    points = [_point("tree", 50.0, 0.01, nodes=0), _point("tree", 60.0, 400.0, nodes=1, depth=1),
              _point("tree", 45.0, 0.01, nodes=2, depth=1), _point("autoregressive", 49.0, 0.01)]
    model = LatencyModel((0, 1, 2), (50.0, 60.0, 45.0), autoregressive_ms=49.0,
                         points=tuple(points), hardware={"kind": "measured"})
    falls = [f for f in model.findings() if "falls as the tree grows" in f.message]
    assert len(falls) == 1 and falls[0].nodes == (0, 2) and "0 -> 2 nodes" in falls[0].message


def test_a_wide_spread_is_too_noisy_and_asks_for_everything_again():
    findings = _noisy_model(iqr=40.0).findings()
    assert findings[0].message.startswith("too noisy") and findings[0].everything


def test_without_a_spread_the_checks_count_any_difference_and_say_so():
    findings = _noisy_model(verify=(50.0, 60.0, 59.5), measured=False).findings()
    assert findings[0].message.startswith("no spread measured")
    assert "any difference counts" in findings[1].message
    assert LatencyModel.cpu_like().findings() == []  # synthetic: nothing measured, no claim
    assert _noisy_model(measured=False).noise_gain_bound() is None


def test_noise_gain_bound_follows_the_knots_relative_error():
    model = _noisy_model(iqr=2.0)
    eps = float(np.median([2.0 / 1.349 / 4.0 / v for v in model.verify_ms]))
    assert model.relative_noise() == pytest.approx(eps)
    assert model.noise_gain_bound() == pytest.approx(1 + NOISE_SIGMAS * math.sqrt(2) * eps)
    quieter = _noisy_model(iqr=0.5)
    assert 1.0 < quieter.noise_gain_bound() < model.noise_gain_bound()


def test_points_and_warnings_round_trip_through_json():
    model = _noisy_model(verify=(50.0, 396.0, 147.0), fused=52.0)
    obj = json.loads(json.dumps(model.to_json()))
    assert obj["noise"]["points"][0]["step"] == "tree"
    assert obj["warnings"] == model.warnings and len(obj["warnings"]) == 1
    back = LatencyModel.from_json(obj)
    assert back == model and back.warnings == model.warnings
    plain = _noisy_model(measured=False).to_json()
    assert plain["noise"] is None  # the explicit "no spread measured" marker
    assert LatencyModel.from_json(plain).points == ()
    bad = dict(obj, noise={"points": [{"step": "nap", "context": 1}]})
    with pytest.raises(EntmtpError, match="latency"):
        LatencyModel.from_json(bad)


def test_too_few_rounds_measure_no_spread():
    model = _noisy_model()
    one_round = dataclasses.replace(model, points=tuple(
        dataclasses.replace(p, rounds=1, iqr_ms=0.0) for p in model.points))
    (finding,) = one_round.findings()
    assert finding.message.startswith("only 1 round(s) per point") and not finding.nodes


def test_a_falling_last_segment_is_not_extrapolated_below_its_last_knot():
    model = LatencyModel((0, 8, 16), (50.0, 200.0, 150.0), autoregressive_ms=49.0)
    assert model.step_ms(16, 0) == 150.0
    assert model.step_ms(1000, 0) == 150.0  # flat, not 150 - 6.25 * 984 < 0
    rising = LatencyModel((0, 8, 16), (50.0, 100.0, 150.0), autoregressive_ms=49.0)
    assert rising.step_ms(24, 0) == pytest.approx(200.0)


def test_the_report_names_the_charges_besides_the_profiled_steps() -> None:
    from entmtp.treesearch._run import _booking_note

    plain = LatencyModel((0, 4), (10.0, 20.0), autoregressive_ms=10.0)
    assert _booking_note(plain) == ""
    static = dataclasses.replace(plain, verify_ms=(10.42, 20.0), hardware={"engine": "static"},
                                 fused_empty_ms_by_depth=(10.5, 10.8, 11.1))
    note = _booking_note(static)
    assert "cost 0.42 ms less" in note and "pays 0.30 ms per head row" in note
