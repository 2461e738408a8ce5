"""Chart text says what it means: nouns in the right number, one memory scale across compared charts,
and the PNG names the same host scale as the playground (the highest peak)."""
from pipeoffload.service import SimulateRequest, simulate
from pipeoffload.viz.chartdata import schedule_title, summary_line
from pipeoffload.viz.plot import TICK_LABEL, timeline_figure


def test_one_of_a_thing_is_singular() -> None:
    t = simulate(SimulateRequest("1f1b", ranks=1, microbatches=1)).timeline
    assert schedule_title(t) == "1f1b: d=1 rank, m=1 microbatch, v=1 stage per rank"
    assert summary_line(t).endswith("device peak 1 rank unit")
    t = simulate(SimulateRequest("zb-v", ranks=2, microbatches=4)).timeline
    assert "d=2 ranks, m=4 microbatches, v=2 stages per rank" in schedule_title(t)


def _memory_title(fig: object) -> str:
    return next(ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left"))  # type: ignore[attr-defined]


def test_compared_charts_share_one_memory_scale_and_name_it() -> None:
    small = simulate(SimulateRequest("1f1b", ranks=2, microbatches=4)).timeline  # peak 2
    fig = timeline_figure(small, ymax=8.0)
    assert "shared scale 0 to 8;" in _memory_title(fig) or "shared scale 0 to 8)" in _memory_title(fig)
    tops = {round(ax.get_ylim()[1], 6) for ax in fig.axes if ax.get_ylabel().startswith("rank ")}
    assert tops == {round(8.0 * 1.15, 6)}


def test_the_host_scale_named_is_the_highest_host_peak() -> None:
    result = simulate(SimulateRequest("1f1b", ranks=2, microbatches=4, offload="all", offload_ratio=0))
    top_host = max(r["peak_host_rank_units"] for r in result.as_dict()["per_rank"])
    assert top_host > 0
    assert f"own scale 0 to {top_host:.3g})" in _memory_title(timeline_figure(result.timeline))


def test_instant_copies_are_drawn_as_ticks_and_the_legend_says_so() -> None:
    from matplotlib.collections import LineCollection

    result = simulate(SimulateRequest("1f1b", ranks=2, microbatches=4, offload="all", offload_ratio=0))
    copies = [a for row in result.timeline.schedule.actions for a in row if a.kind.name.startswith(("OFFLOAD", "RELOAD"))]
    fig = timeline_figure(result.timeline)
    gantt = fig.axes[0]
    ticks = sum(len(c.get_segments()) for c in gantt.collections if isinstance(c, LineCollection))
    assert copies and ticks == len(copies)
    assert any(t.get_text() == TICK_LABEL for legend in fig.legends for t in legend.get_texts())


def test_busy_shares_are_the_covered_part_of_each_slice() -> None:
    import numpy as np

    from pipeoffload.viz.plot import busy_shares

    shares = busy_shares(np.array([0.0, 2.5]), np.array([1.0, 4.0]), np.array([0.0, 2.0, 4.0]))
    assert shares.tolist() == [0.5, 0.75]


def test_a_chart_of_too_many_boxes_draws_utilisation_bands_and_says_so() -> None:
    from matplotlib.image import AxesImage

    from pipeoffload.viz.plot import AGGREGATE_ABOVE

    result = simulate(SimulateRequest("1f1b", ranks=4, microbatches=800, offload="all", offload_ratio=0.5))
    boxes = len([a for row in result.timeline.schedule.actions for a in row])
    assert boxes > AGGREGATE_ABOVE
    fig = timeline_figure(result.timeline)
    gantt = fig.axes[0]
    assert sum(isinstance(a, AxesImage) for a in gantt.get_images()) == 4 * 2  # a compute and a copy band per rank
    assert not gantt.collections  # no single boxes
    texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert any("too many to draw one by one" in t for t in texts) and "copy lane: share of each slice copying" in texts
    small = timeline_figure(simulate(SimulateRequest("1f1b", ranks=2, microbatches=4)).timeline)
    assert not small.axes[0].get_images() and small.axes[0].collections
