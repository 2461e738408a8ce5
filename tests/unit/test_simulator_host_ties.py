"""Host memory at equal times follows the copies' order on the rank, as the runtime issues them.

With instant copies (k = 0, ``train``'s default cost model) 1F1B on 2 ranks lowers rank 0's warm-up to
``OFFLOAD(0,1), RELOAD(0,0)`` at one instant: the runtime holds both on the host (2 units; the run's
``host_bytes`` is two slots), while the simulator, ordering frees before allocations at equal times as
it does for device memory, freed the reload's host copy first and reported 1."""
from __future__ import annotations

from pipeoffload.costs import CostModel
from pipeoffload.passes.lower import lower
from pipeoffload.schedules import generate
from pipeoffload.simulator import simulate


def _rank0_host_order(schedule) -> list[str]:
    return [str(a) for a in schedule.actions[0] if "OFFLOAD" in str(a) or "RELOAD" in str(a)]


def test_instant_copies_count_the_host_copies_the_runtime_holds_at_once() -> None:
    lowered = lower(generate("1f1b", 2, 4), None, offload="all")
    order = _rank0_host_order(lowered)
    # the offload of microbatch 1 is issued before the reload of microbatch 0
    assert order.index("0OFFLOAD1") < order.index("0RELOAD0"), order
    timeline = simulate(lowered, CostModel())
    assert timeline.per_rank[0].peak_host_units == 2


def test_device_memory_still_frees_first_at_equal_times() -> None:
    lowered = lower(generate("1f1b", 2, 4), None, offload="all")
    assert simulate(lowered, CostModel()).per_rank[0].peak_activation_units == 1
