"""Layer splits: even (Megatron's rule) and balanced (head weighed; embedding-only and head-only stages)."""
import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.placement import Placement
from pipeoffload.planner.estimate import EstimateRequest, estimate
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.split import balanced_split, even_split


def _rank_loads(split: tuple[int, ...], placement: Placement, head: float) -> list[float]:
    last = placement.num_stages - 1
    return [sum(split[s] + (head if s == last else 0.0) for s in placement.stages_of(r))
            for r in range(placement.num_ranks)]


def test_the_paper_layout_gets_an_embedding_stage_and_a_head_stage() -> None:
    """62 layers over PP32 x 2 = 64 stages: every inner stage one layer, the first and last none."""
    split = balanced_split(62, Placement.loop(32, 2), head_weight=0.4)
    assert split[0] == 0 and split[-1] == 0 and set(split[1:-1]) == {1} and sum(split) == 62


@pytest.mark.parametrize("layers, d, v, head", [(40, 4, 2, 0.3), (78, 32, 2, 0.4), (62, 4, 4, 0.4), (61, 8, 1, 1.7),
                                                (96, 8, 2, 0.0), (30, 4, 1, 2.5)])
def test_balanced_never_loads_the_busiest_rank_more_than_even(layers: int, d: int, v: int, head: float) -> None:
    placement = Placement.loop(d, v)
    balanced = balanced_split(layers, placement, head)
    assert sum(balanced) == layers and min(balanced[1:-1]) >= 1
    best = max(_rank_loads(balanced, placement, head))
    assert best <= max(_rank_loads(even_split(layers, d * v), placement, head)) + 1e-9
    assert best - (layers + head) / d < 1 + head + 1e-9  # within one layer (+ the head) of a perfect split


def test_a_heavy_head_moves_layers_off_the_last_rank() -> None:
    placement = Placement.loop(4, 1)
    assert balanced_split(30, placement, head_weight=2.5) == (8, 8, 8, 6)
    assert even_split(30, 4) == (8, 8, 7, 7)


def test_too_few_layers_is_one_line() -> None:
    with pytest.raises(ConfigError, match="every other stage needs a layer"):
        balanced_split(5, Placement.loop(4, 2), 0.3)


def test_estimate_takes_the_balanced_split_where_even_is_refused() -> None:
    hw = hardware_preset("a100")
    model = ModelSpec(layers=62, hidden=2048, heads=16, seq=2048)
    with pytest.raises(ConfigError, match="or split=balanced"):
        EstimateRequest(model=model, hardware=hw, pp=32, global_batch=64, schedule="interleaved-1f1b",
                        stages_per_rank=2)
    est = estimate(EstimateRequest(model=model, hardware=hw, pp=32, global_batch=64, schedule="interleaved-1f1b",
                                   stages_per_rank=2, split="balanced"))
    assert est.layers_per_stage[0] == 0 and est.layers_per_stage[-1] == 0 and est.step_seconds > 0


def test_plan_searches_layouts_only_the_balanced_split_can_express() -> None:
    from pipeoffload.planner.plans import PlanRequest
    from pipeoffload.planner.search import find_plans

    hw = hardware_preset("a100")
    model = ModelSpec(layers=14, hidden=1024, heads=8, seq=1024)
    kw = dict(model=model, hardware=hw, gpus=8, global_batch=32, memory_budget=hw.memory_bytes, tp_sizes=(1,),
              pp_sizes=(8,), schedules=("interleaved-1f1b",), stages_per_rank=(2,), offload=("none",),
              recompute=("none",), top=1)
    with pytest.raises(ConfigError):
        find_plans(PlanRequest(**kw))  # type: ignore[arg-type]  # 16 stages for 14 layers
    plan = find_plans(PlanRequest(split="balanced", **kw)).best(1)[0]  # type: ignore[arg-type]
    assert plan.layout.pp == 8 and plan.choice.stages_per_rank == 2
