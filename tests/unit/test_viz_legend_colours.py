"""The chart's legend fits the picture and its kinds' colours can be told apart: a legend of 8 columns
of the longest entries ran past both edges of the 13-inch figure ("F forward" showed as "forward",
"host memory" as "host me"), and RELOAD_W was drawn in nearly RELOAD's pink (22 apart in RGB)."""
import itertools
import math
from dataclasses import replace

import pytest

from pipeoffload import generate, lower, schedule_names, simulate
from pipeoffload.ir import ActionKind
from pipeoffload.units import rank_costs
from pipeoffload.viz.chartdata import COLOURS, KIND_ORDER, ChartData, chart_data
from pipeoffload.viz.plot import chart_figure

K = ActionKind


def _rgb(colour: str) -> tuple[int, ...]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def _grey(colour: str) -> float:
    r, g, b = _rgb(colour)
    return 0.299 * r + 0.587 * g + 0.114 * b


@pytest.mark.parametrize("a,b", list(itertools.combinations(KIND_ORDER, 2)), ids=str)
def test_every_pair_of_kinds_differs_in_colour(a: ActionKind, b: ActionKind) -> None:
    assert math.dist(_rgb(COLOURS[a]), _rgb(COLOURS[b])) >= 50, (a, COLOURS[a], b, COLOURS[b])


@pytest.mark.parametrize("first,second", [(K.OFFLOAD, K.OFFLOAD_W), (K.RELOAD, K.RELOAD_W)])
def test_the_two_windows_copies_of_one_direction_differ_in_grey(first: ActionKind, second: ActionKind) -> None:
    """They share a half of the copy lane, where no microbatch number tells them apart."""
    assert abs(_grey(COLOURS[first]) - _grey(COLOURS[second])) >= 10


def _data(family: str, d: int, m: int, offload: str) -> ChartData:
    schedule = generate(family, d, m)
    costs = rank_costs(1, 1, 1, schedule.stages_per_rank).with_offload_ratio(0.5)
    return chart_data(simulate(lower(schedule, costs, offload=offload), costs))


def _assert_legend_fits(data: ChartData) -> None:
    """The legend inside the figure, below the summary line and above the chart (Agg's extents) at each
    resolution pictures are written at (hinted text is wider at some: 130 dpi clipped, 100 did not)."""
    import matplotlib.pyplot as plt

    fig = chart_figure(data)
    try:
        for dpi in (80, 90, 100, 130, 200):
            fig.set_dpi(dpi)
            renderer = fig.canvas.get_renderer()
            legend, page = fig.legends[0].get_window_extent(renderer), fig.bbox
            summary = min(t.get_window_extent(renderer).y0 for t in fig.texts)
            gantt = fig.axes[0].get_window_extent(renderer)
            assert page.x0 <= legend.x0 and legend.x1 <= page.x1, (dpi, legend, page)
            assert gantt.y1 <= legend.y0 and legend.y1 <= summary, (dpi, gantt.y1, legend, summary)
    finally:
        plt.close(fig)


def test_the_widest_legend_fits_the_picture() -> None:
    """Every kind, two lighter shades, the tick, device and host memory: every entry the legend can have."""
    data = _data("zb-v", 4, 8, "all")
    assert any(b.end <= b.start for b in data.boxes if b.lane == "copy") and max(c.peak for c in data.host) > 0
    _assert_legend_fits(replace(data, kinds=tuple(k.value for k in KIND_ORDER), stages_per_rank=3))


@pytest.mark.parametrize("family", schedule_names())
@pytest.mark.parametrize("offload", ["none", "all"])
def test_the_legend_fits_the_picture(family: str, offload: str) -> None:
    _assert_legend_fits(_data(family, 4, 8, offload))
