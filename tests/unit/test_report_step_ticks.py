"""`pipeoffload report RUN`'s loss chart marks whole steps: a 3-step run's axis read 1.00, 1.25, ... 3.00."""
import pytest

from pipeoffload.train.report import RunMetrics, report_figure


@pytest.mark.parametrize("steps", [2, 3, 7])
def test_the_loss_charts_step_ticks_are_whole_steps(steps: int) -> None:
    import matplotlib.pyplot as plt

    rows = [{"step": s, "loss": 5.0 - s * 0.1, "peak_act_bytes": [1 << 20]} for s in range(1, steps + 1)]
    fig = report_figure(RunMetrics(rows))
    try:
        ax = fig.axes[0]
        low, high = ax.get_xlim()
        shown = [t for t in ax.get_xticks() if low <= t <= high]
        assert shown and all(float(t).is_integer() for t in shown), shown
    finally:
        plt.close(fig)
