"""How much slower the planner's best plan is because it costs the loss as Megatron runs it: the
vocabulary-parallel cross entropy's passes over fp32 logits, 52 bytes of HBM traffic per logit per
microbatch (``planner.layertime.loss_elementwise_bytes``; docs/planner.md, "Assumptions that move the
numbers").

    PYTHONPATH=. .venv/bin/python benchmarks/loss_cost_effect.py [--global-batch 512]

For each model (gpt3-1.3b on 8 A100s, llama3-8b on 16, gpt3-13b on 32, gpt3-175b on 64; 90 % memory
budget, every schedule, offload and recompute option ``plan`` searches by default) it runs the plan
search twice: as shipped, and with the loss's elementwise passes left out (``loss_elementwise_bytes``
replaced by zero bytes inside this process: the planner has no option for it; the head's GEMM and the
loss's three per-token TP all-reduces stay). It prints the best plan of each and how much longer the
shipped plan's step is. A fused or bf16 loss (PyTorch's ``F.cross_entropy`` on bf16 logits: ~15 bytes
per logit) sits between the two. Deterministic: simulated figures only; a run takes about a minute.
"""
from __future__ import annotations

import argparse
from unittest import mock

from pipeoffload.planner import layertime
from pipeoffload.planner.hardware import hardware_preset
from pipeoffload.planner.plans import Plan, PlanRequest
from pipeoffload.planner.presets import model_preset
from pipeoffload.planner.search import find_plans

RUNS = (("gpt3-1.3b", 8), ("llama3-8b", 16), ("gpt3-13b", 32), ("gpt3-175b", 64))


def best(model: str, gpus: int, batch: int) -> Plan:
    hw = hardware_preset("a100")
    req = PlanRequest(model=model_preset(model), hardware=hw, gpus=gpus, global_batch=batch,
                      memory_budget=0.9 * hw.memory_bytes, top=1)
    return find_plans(req).best(1)[0]


def label(plan: Plan) -> str:
    c = plan.choice
    return f"{plan.layout} {c.family} v{c.stages_per_rank} m{plan.microbatches} {plan.step_time:.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--global-batch", type=int, default=512, help="sequences per step (default 512)")
    args = parser.parse_args()
    print(f"A100 (80 GiB, 90 % budget), global batch {args.global_batch}; best plan: layout, schedule, v, m, step time")
    print(f"{'model':10} {'gpus':>4}  {'loss costed (as shipped)':44} {'loss passes left out':44} {'slower':>7}")
    for model, gpus in RUNS:
        shipped = best(model, gpus, args.global_batch)
        with mock.patch.object(layertime, "loss_elementwise_bytes", lambda model, tp: (0.0, 0.0)):
            without = best(model, gpus, args.global_batch)
        slower = shipped.step_time / without.step_time - 1.0
        print(f"{model:10} {gpus:>4}  {label(shipped):44} {label(without):44} {100 * slower:>6.1f}%")


if __name__ == "__main__":
    main()
