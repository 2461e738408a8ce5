"""Code that runs inside spawned gloo processes (imported by name in the children).

One spawn per world size runs many (schedule, policy) cases in a loop and returns plain results;
the tests in this folder assert on them. The single-process reference is computed in every worker
(same seeds, same thread count), so the comparison is exact where the arithmetic is identical.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from pipeoffload import generate, lower
from pipeoffload.costs import CostModel
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
from pipeoffload.models.split import StageModule
from pipeoffload.policies import OffloadPolicy
from pipeoffload.runtime import PipelineRunner

K = ActionKind
STEPS = 3
LR = 0.1


@dataclass(frozen=True)
class Case:
    schedule: str  # registry name, or "<name>+iw" for the name with every B split into I then W
    stages_per_rank: int
    policy: str = "none"  # "none" or "<offload|recompute>:<policy text>", passed to lower()
    options: tuple = ()
    costs: tuple = ()  # (CostModel field, value) pairs the policy is planned with; "offload_ratio" sets k,
    # "max_stall" the offload policy's stall budget

    def __str__(self) -> str:
        return f"{self.schedule}/v{self.stages_per_rank}/{self.policy}" + "".join(f"/{k}={v}" for k, v in self.costs)


def split_backward(schedule: Schedule) -> Schedule:
    """Every B becomes I immediately followed by W (exercises the I/W path on any schedule)."""
    rows = []
    for row in schedule.actions:
        out = []
        for a in row:
            if a.kind == K.B:
                out += [Action(K.I, a.stage, a.microbatch), Action(K.W, a.stage, a.microbatch)]
            else:
                out.append(a)
        rows.append(out)
    return schedule.with_actions(rows)


def build_schedule(case: Case, world: int, microbatches: int) -> Schedule:
    """The case's schedule, lowered with its offload/recompute policy by ``lower``'s own passes."""
    name = case.schedule.removesuffix("+iw")
    schedule = generate(name, world, microbatches, case.stages_per_rank, **dict(case.options))
    if case.schedule.endswith("+iw"):
        schedule = split_backward(schedule)
    costs = CostModel(**{k: v for k, v in case.costs if k not in ("offload_ratio", "max_stall")})
    ratio = dict(case.costs).get("offload_ratio")
    costs = costs if ratio is None else costs.with_offload_ratio(ratio)
    if case.policy == "none":
        return lower(schedule, costs)
    what, _, which = case.policy.partition(":")
    if what == "offload":  # with the case's stall budget, if any
        stall = dict(case.costs).get("max_stall", 0.0)
        return lower(schedule, costs, offload=replace(OffloadPolicy.parse(which), max_stall=stall))
    return lower(schedule, costs, **{what: which})


def _config(dropout: float = 0.0) -> GPTConfig:
    return GPTConfig(vocab=32, seq=8, hidden=16, heads=2, layers=6, dropout=dropout)


def _batches(cfg: GPTConfig, rows: int) -> list[tuple[Any, torch.Tensor]]:
    return [sample_batch(cfg, rows, seed=100 + step) for step in range(STEPS)]


def reference(cfg: GPTConfig, microbatches: int, batches: list) -> tuple[list, list]:
    """Single-process run of the whole model: per step, the loss and every layer's gradients."""
    layers = gpt_layers(cfg, seed=0)
    model = StageModule(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], []
    for (tokens, mask, offset), targets in batches:
        total = None
        for tok, msk, tgt in zip(tokens.tensor_split(microbatches), mask.tensor_split(microbatches),
                                 targets.tensor_split(microbatches)):
            loss = lm_loss(model(tok, msk, offset), tgt) / microbatches
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        losses.append(total)
        grads.append([[p.grad.clone() for p in layer.parameters()] for layer in layers])
        opt.step()
        opt.zero_grad()
    return losses, grads


def _compare(stages: dict[int, StageModule], starts: dict[int, int], ref_grads: list) -> tuple[bool, float]:
    equal, worst = True, 0.0
    for s, module in stages.items():
        for j, layer in enumerate(module):
            for p, r in zip(layer.parameters(), ref_grads[starts[s] + j]):
                if p.grad is None or not torch.equal(p.grad, r):
                    equal = False
                    worst = max(worst, float("inf") if p.grad is None else (p.grad - r).abs().max().item())
    return equal, worst


def run_case(rank: int, world: int, case: Case, cfg: GPTConfig, batches: list, ref: tuple | None,
             microbatches: int) -> dict:
    schedule = build_schedule(case, world, microbatches)
    layers = gpt_layers(cfg, seed=0)
    counts = even_counts(len(layers), schedule.num_stages)
    starts = {s: sum(counts[:s]) for s in range(len(counts))}
    stages = build_rank_stages(layers, counts, schedule.placement, rank)
    params = [p for m in stages.values() for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=LR)
    runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, timeout=60, min_offload_bytes=256)
    out: dict = {"case": str(case), "rank": rank, "loss_equal": [], "grads_equal": [], "max_diff": 0.0,
                 "trace_ok": [], "end_bytes": [], "peaks": [], "losses": []}
    for step, (inputs, targets) in enumerate(batches):
        loss = runner.step(inputs, targets)
        trace = runner.trace
        out["trace_ok"].append(trace.matches(schedule.actions[rank]))
        out["end_bytes"].append(trace.end_bytes)
        out["peaks"].append(trace.peak_bytes)
        if loss is not None:
            out["losses"].append(loss.item())
        if ref is not None:
            ref_losses, ref_grads = ref
            if loss is not None:
                out["loss_equal"].append(torch.equal(loss, ref_losses[step]))
            equal, worst = _compare(stages, starts, ref_grads[step])
            out["grads_equal"].append(equal)
            out["max_diff"] = max(out["max_diff"], worst)
        opt.step()
        opt.zero_grad()
    out["slot_bytes"] = dict(runner.slot_bytes)
    out["w_bytes"] = dict(runner.w_bytes)
    out["schedule"] = schedule.to_json()
    out["trace"] = trace.as_dict()
    return out


def equivalence_worker(rank: int, world: int, cases: list[Case], dropout: float = 0.0) -> list[dict]:
    """Run every case for 3 SGD steps; compare with the single-process reference."""
    cfg = _config(dropout)
    microbatches = world + 2  # more microbatches than ranks: warm-up, steady state and cool-down all occur
    batches = _batches(cfg, 2 * microbatches)
    ref = reference(cfg, microbatches, batches) if dropout == 0.0 else None
    return [run_case(rank, world, case, cfg, batches, ref, microbatches) for case in cases]


class _Boom(torch.nn.Module):
    """Raises in the forward of one microbatch of one step (counted by calls)."""

    def __init__(self, fail_call: int) -> None:
        super().__init__()
        self.calls = 0
        self.fail_call = fail_call

    def forward(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_call:
            raise ValueError("injected failure")
        return args


def failure_worker(rank: int, world: int, bad_rank: int, fail_call: int) -> None:
    """Rank ``bad_rank`` raises inside one forward; returns only if nothing failed (it must not)."""
    cfg = _config()
    microbatches = 2 * world
    schedule = build_schedule(Case("1f1b", 1), world, microbatches)
    layers = gpt_layers(cfg, seed=0)
    counts = even_counts(len(layers), schedule.num_stages)
    stages = build_rank_stages(layers, counts, schedule.placement, rank)
    if rank == bad_rank:
        (s, module), = stages.items()
        stages[s] = StageModule(*module, _Boom(fail_call)) if s < schedule.num_stages - 1 else module
    runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, timeout=40)
    for inputs, targets in _batches(cfg, 2 * microbatches):
        runner.step(inputs, targets)
    return None


def mp_spawn_entry(rank: int, world: int, folder: str) -> None:
    """Entry point for ``torch.multiprocessing.spawn``: its own rendezvous, one step, result to a file."""
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        cfg = _config()
        schedule = build_schedule(Case("1f1b", 1), world, 2 * world)
        layers = gpt_layers(cfg, seed=0)
        stages = build_rank_stages(layers, even_counts(len(layers), schedule.num_stages), schedule.placement, rank)
        runner = PipelineRunner(stages, schedule, rank, loss_fn=lm_loss, timeout=60)
        inputs, targets = _batches(cfg, 4 * world)[0]
        loss = runner.step(inputs, targets)
        with open(f"{folder}/rank{rank}.txt", "w") as fh:
            fh.write(f"{loss.item() if loss is not None else 'none'} {runner.trace.matches(schedule.actions[rank])}")
    finally:
        dist.destroy_process_group()
