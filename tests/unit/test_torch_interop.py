"""Round trips with torch.distributed.pipelining (torch 2.13): its orders here, ours in its runtime."""
import csv
import io

import pytest

from pipeoffload import CostModel, Schedule, generate, lower, simulate, validate
from pipeoffload.ir import COMM_KINDS

pytest.importorskip("torch.distributed.pipelining")
from pipeoffload.torch_interop import (  # noqa: E402
    expand_overlaps,
    load_in_torch_runtime,
    schedule_from_torch_csv,
    torch_order_csv,
    torch_schedule,
)

HALF = CostModel.uniform(0.5, 0.5, 0.5)
UNIT = CostModel.uniform(1.0, 1.0, 1.0)
SIZES = [(2, 4), (4, 8), (4, 16), (8, 16), (8, 32)]


@pytest.mark.parametrize("name,v", [("zb-v", 2), ("v-half", 2), ("v-min", 2), ("1f1b-v", 2), ("dualpipe-v", 2),
                                    ("zb-h1", 1), ("zb-h2", 1), ("zb", 1)])
def test_our_schedules_load_validate_lower_and_dry_run_in_torch_runtime(name: str, v: int) -> None:
    for d, m in ((2, 4), (4, 8), (3, 7), (8, 16)):
        schedule = generate(name, d, m, v)
        lowered_by_torch = load_in_torch_runtime(schedule)
        ours = lower(schedule)
        for kind in COMM_KINDS:  # both lowerings move the same activations and gradients
            theirs = sum(1 for row in lowered_by_torch.values() for a in row if a[1:].lstrip("0123456789")
                         .startswith(kind.value) and not a.endswith("OVERLAP_F_B"))
            assert theirs == sum(1 for row in ours for a in row if a.kind == kind), (name, d, m, kind)


def test_torch_runtime_rejects_a_deadlocking_order() -> None:
    bad = Schedule.from_text("0F0 0I0 0W0 0F1 0I1 0W1\n1F1 1I1 1W1 1F0 1I0 1W0\n")
    with pytest.raises((AssertionError, ValueError), match="Malformed|not progressing"):
        load_in_torch_runtime(bad)  # torch's comm pass finds no order for the sends and receives


def test_our_csv_cells_parse_as_torch_actions() -> None:
    from torch.distributed.pipelining.schedules import _Action

    schedule = generate("zb-v", 4, 8, 2)
    for row in csv.reader(io.StringIO(schedule.to_csv())):
        assert [str(_Action.from_str(cell)) for cell in row] == row


@pytest.mark.parametrize("cls,v", [("ZBVZeroBubble", 2), ("InterleavedZeroBubble", 1),
                                   ("InterleavedZeroBubble", 2), ("DualPipeV", 2), ("Interleaved1F1B", 2)])
def test_torch_orders_from_csv_validate_lower_and_simulate_here(cls: str, v: int) -> None:
    for d, m in SIZES:
        schedule = torch_schedule(cls, d, m, v)
        assert (schedule.num_ranks, schedule.num_microbatches, schedule.stages_per_rank) == (d, m, v)
        validate(schedule)
        simulate(lower(schedule), CostModel.uniform(1 / v, 1 / v, 1 / v, p2p=0.1))


def test_zb_v_no_worse_than_torch_zbv_and_zb_h1_than_torch_zb1p() -> None:
    for d, m in SIZES:
        for ours, theirs, v in (("zb-v", "ZBVZeroBubble", 2), ("zb-h1", "InterleavedZeroBubble", 1)):
            costs = HALF if v == 2 else UNIT
            a = simulate(generate(ours, d, m, v), costs)
            b = simulate(torch_schedule(theirs, d, m, v), costs)
            assert a.bubble_ratio <= b.bubble_ratio + 1e-9 and a.peak_activation_units <= b.peak_activation_units


@pytest.mark.parametrize("v", [1, 2, 4])
def test_our_zb_h1_is_torchs_zb1p_order(v: int) -> None:
    for d, m in SIZES + [(3, 3), (4, 3), (8, 24)]:
        assert generate("zb-h1", d, m, v).to_text() == torch_schedule("InterleavedZeroBubble", d, m, v).to_text()


def test_our_dualpipe_v_is_torchs_dualpipev_order() -> None:
    for d, m in SIZES + [(1, 2), (3, 7), (8, 17)]:
        ours = generate("dualpipe-v", d, m, 2)
        theirs = torch_schedule("DualPipeV", d, m, 2)
        assert ours.to_text() == theirs.to_text(), (d, m)


def test_torch_zbv_and_dualpipev_use_v_placement() -> None:
    assert torch_schedule("ZBVZeroBubble", 4, 8, 2).placement.kind == "v"
    assert torch_schedule("DualPipeV", 4, 8, 2).placement.kind == "v"


def test_overlapped_cells_become_forward_then_backward_and_bookkeeping_is_dropped() -> None:
    text = "0F0,,(0F1;3B0)OVERLAP_F_B,0REDUCE_GRAD\n1F0,1UNSHARD,2B0\n"
    assert expand_overlaps(text) == "0F0,,0F1,3B0\n1F0,2B0\n"
    csv_text = torch_order_csv("DualPipeV", 2, 4, 2)
    assert "OVERLAP_F_B" in csv_text
    assert "OVERLAP" not in schedule_from_torch_csv(csv_text).to_text()
