"""The chart builder's data: every timed action once at its simulated time, every rank's memory curves;
the pictures drawn from it are valid, non-trivial files (no pixel comparisons)."""
from collections import Counter

import pytest

from pipeoffload import generate, lower, simulate
from pipeoffload.ir import COMPUTE_KINDS, COPY_KINDS
from pipeoffload.units import rank_costs
from pipeoffload.viz.chartdata import chart_data
from pipeoffload.viz.plot import figure_bytes, shade, timeline_figure


def _timeline(name: str, d: int, m: int, v: int | None = None, offload: str = "none", **options):  # type: ignore[no-untyped-def]
    schedule = generate(name, d, m, v, **options)
    costs = rank_costs(1, 1, 1, schedule.stages_per_rank).with_offload_ratio(0.5)
    return simulate(lower(schedule, costs, offload=offload), costs)


@pytest.fixture(scope="module")
def offloaded():  # type: ignore[no-untyped-def]
    return _timeline("group-interleaved", 4, 8, 2, offload="all", group_size=2)


def test_every_compute_and_copy_action_once_at_its_simulated_time(offloaded) -> None:  # type: ignore[no-untyped-def]
    data = chart_data(offloaded)
    expected = Counter(
        (rank, str(a), s, e) for rank in range(4) for a, s, e in offloaded.events(rank)
        if a.kind in COMPUTE_KINDS or a.kind in COPY_KINDS
    )
    drawn = Counter((b.rank, b.action, b.start, b.end) for b in data.boxes)
    assert drawn == expected and sum(expected.values()) > 100
    assert {b.lane for b in data.boxes if b.kind in ("OFFLOAD", "RELOAD")} == {"copy"}
    assert data.copy_lanes and "OFFLOAD" in data.kinds and "RELOAD" in data.kinds
    assert {b.shade for b in data.boxes} == {0, 1}  # a rank's second stage is drawn in the lighter shade


def test_every_rank_has_device_and_host_curves_in_rank_units(offloaded) -> None:  # type: ignore[no-untyped-def]
    data = chart_data(offloaded)
    assert [c.rank for c in data.device] == [c.rank for c in data.host] == [0, 1, 2, 3]
    for curve, result in zip(data.device, offloaded.per_rank):
        assert curve.peak == pytest.approx(result.peak_rank_units)
        assert curve.points[0][0] == 0.0 and curve.points[-1][0] == pytest.approx(offloaded.makespan)
        times = [t for t, _ in curve.points]
        assert times == sorted(times) and len(set(times)) == len(times)  # one settled level per instant
    for curve, result in zip(data.host, offloaded.per_rank):
        assert curve.peak == pytest.approx(result.peak_host_units / 2) and curve.peak > 0
    assert "rank units" in data.summary and " t," in data.summary  # every number says its unit


def test_no_copy_lane_without_offload() -> None:
    data = chart_data(_timeline("1f1b", 3, 4))
    assert not data.copy_lanes and data.kinds == ("F", "B")
    assert all(c.peak == 0 for c in data.host)
    assert [c.peak for c in data.device] == [3, 2, 1]


def test_shade_is_lighter_for_later_stages() -> None:
    assert shade("#4C72B0", 0, 2) == "#4c72b0"
    darkest, lighter = (sum(int(shade("#4C72B0", i, 3)[j:j + 2], 16) for j in (1, 3, 5)) for i in (0, 2))
    assert lighter > darkest


@pytest.mark.parametrize("fmt,magic", [("png", b"\x89PNG"), ("svg", b"<svg"), ("pdf", b"%PDF")])
def test_pictures_are_valid_files(offloaded, fmt: str, magic: bytes) -> None:  # type: ignore[no-untyped-def]
    raw = figure_bytes(timeline_figure(offloaded), fmt, dpi=60)
    assert magic in raw[:400] and len(raw) > 10_000


def test_large_full_offload_chart_is_drawn_with_every_rank_panel() -> None:
    timeline = _timeline("group-interleaved", 16, 64, 2, offload="all")
    fig = timeline_figure(timeline)
    labels = {ax.get_ylabel() for ax in fig.axes}
    assert {f"rank {r}" for r in range(16)} <= labels
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sum(t.startswith("peak ") for t in texts) == 16  # each rank's peak annotated
    assert any("host" in (t or "") for t in (h.get_label() for h in fig.legends[0].legend_handles))
    raw = figure_bytes(fig, "png", dpi=50)
    assert raw.startswith(b"\x89PNG") and len(raw) > 50_000


def test_microbatch_numbers_only_where_boxes_are_wide_enough() -> None:
    small = _timeline("1f1b", 4, 8)
    fig = timeline_figure(small, memory=False)
    numbers = [t.get_text() for t in fig.axes[0].texts]
    assert sorted(numbers) == sorted(str(b.microbatch) for b in chart_data(small).boxes)  # every box numbered
    large = _timeline("1f1b", 16, 256)
    labelled = len(timeline_figure(large, memory=False).axes[0].texts)
    assert labelled < len(chart_data(large).boxes) / 4  # too narrow to read: left out, not overprinted
    assert fig.axes[0].get_xlabel().startswith("time (t = ")
