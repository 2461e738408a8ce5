"""The recompute pass: drop chosen activations after F and insert R right before their backward.

R runs on the compute lane, so each recomputed activation costs one more forward of its stage; it
is resident only from the start of R to the end of its backward. R goes immediately before the
backward (before its RECV_B once comms are added), so it overlaps the wait for the output gradient.

Choosing what to recompute (see ``RecomputePolicy``):
- ``all``: every activation whose backward does not directly follow its forward (recomputing
  those would cost time and save nothing), minus what ``offload first:K`` takes;
- ``first:K``: every microbatch of the K longest-lived local stages on each rank (with ``offload
  first:K'``, the K stages after the K' that offload takes: each stage gets one treatment), except
  activations whose backward directly follows their forward (nothing to gain);
- ``auto``: what the offload pass wanted off the device but its copy lane could not hide, or, under
  an offload budget, the longest-lived activations that keep a rank above the budget after offload.
Partial recomputation needs no action: ``RecomputePolicy.apply_to`` changes the cost model.
"""
from __future__ import annotations

import numpy as np

from pipeoffload.costs import CostModel
from pipeoffload.errors import ConfigError
from pipeoffload.ir import Action, ActionKind, Schedule
from pipeoffload.passes.copy_plan import EPS, RankTimeline, rank_timelines
from pipeoffload.passes.offload import OffloadReport, longest_lived_stages
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.simulator import Timeline

K = ActionKind
Key = tuple[int, int]


def check_policies(offload: OffloadPolicy, recompute: RecomputePolicy) -> None:
    if recompute.kind == "auto" and offload.kind == "none":
        raise ConfigError.named(lambda n: (
            f"{n.given('recompute', 'auto')} needs a target: it recomputes what the offload policy could not move; "
            f"pass {n.given('offload', 'budget:X')} (or all, first:K, auto), or use {n.given('recompute', 'first:K')}"
        ))
    if recompute.kind == "auto" and offload.max_stall > 0:  # both act on what the copy lane cannot hide
        raise ConfigError.named(lambda n: (
            f"{n.given('max_stall', f'{offload.max_stall:g}')} with {n.given('recompute', 'auto')}: both deal with "
            "what the copy lane cannot hide "
            "(a stall budget by letting copies stall, recompute auto by recomputing), and recompute auto would "
            f"judge the stall plan by its planned copies; use one of them (e.g. {n.given('recompute', 'first:K')} "
            "with the budget)"
        ))


def insert_recompute(schedule: Schedule, keys: set[Key] | frozenset[Key]) -> Schedule:
    """Add ``{stage}R{mb}`` right before the backward (B or I) of every (stage, microbatch) in ``keys``."""
    if not keys:
        return schedule
    rows = []
    for row in schedule.actions:
        out: list[Action] = []
        for a in row:
            if (a.kind is K.B or a.kind is K.I) and (a.stage, a.microbatch) in keys:
                out.append(Action(K.R, a.stage, a.microbatch))
            out.append(a)
        rows.append(out)
    return schedule.with_actions(rows)


def _timelines(schedule: Schedule, timeline: Timeline, costs: CostModel) -> list[RankTimeline]:
    return rank_timelines(schedule, timeline, costs)


def first_stage_keys(schedule: Schedule, timeline: Timeline, costs: CostModel, count: int,
                     offload: OffloadPolicy) -> set[Key]:
    """Keys of the ``count`` longest-lived local stages per rank, after those ``offload first:K`` takes."""
    keys: set[Key] = set()
    for tl in _timelines(schedule, timeline, costs):
        taken = longest_lived_stages(tl.activations.values(), offload.count) if offload.kind == "first" else []
        stages = set(longest_lived_stages(tl.activations.values(), count, skip=set(taken)))
        keys.update(k for k, x in tl.activations.items() if x.stage in stages and x.lifespan > EPS)
    return keys


def all_keys(schedule: Schedule, timeline: Timeline, costs: CostModel, offload: OffloadPolicy) -> set[Key]:
    """Every activation alive beyond its forward, except the stages ``offload first:K`` takes."""
    keys: set[Key] = set()
    for tl in _timelines(schedule, timeline, costs):
        taken = set(longest_lived_stages(tl.activations.values(), offload.count)) if offload.kind == "first" else set()
        keys.update(k for k, x in tl.activations.items() if x.lifespan > EPS and x.stage not in taken)
    return keys


def auto_keys(schedule: Schedule, timeline: Timeline, costs: CostModel, report: OffloadReport,
              offloaded: set[Key], budget: float | None = None) -> set[Key]:
    """What ``recompute auto`` recomputes, given the offload pass's plan on ``timeline``: what it could
    not hide, or, with a ``budget`` (activation units; default the report's), the longest-lived
    activations the plan leaves on the device where its memory is above the budget."""
    budget = report.budget if budget is None else budget
    if budget is None:
        return set(report.unhidden)
    keys: set[Key] = set()
    planned = {r.rank: r.memory for r in report.per_rank}
    for tl in _timelines(schedule, timeline, costs):
        memory = np.array(planned.get(tl.rank) or tl.memory, dtype=float)
        keys |= _cover_excess(tl, memory, budget, offloaded)
    return keys


def _cover_excess(tl: RankTimeline, memory: np.ndarray, budget: float, offloaded: set[Key]) -> set[Key]:
    """Longest-lived first, recompute activations resident where the planned memory exceeds the budget.

    A recomputed activation is counted as gone from the end of its F to the start of its backward
    (R really re-allocates one forward earlier); the final simulation gives the exact peak.
    """
    chosen: set[Key] = set()
    for key, x in sorted(tl.activations.items(), key=lambda kv: (-kv[1].lifespan, kv[0])):
        if memory.max() <= budget + EPS:
            break
        if key in offloaded:
            continue
        lo, hi = tl.off_range(x.f_end, x.deadline)
        if hi > lo and memory[lo:hi].max() > budget + EPS:
            memory[lo:hi] -= x.size
            chosen.add(key)
    return chosen
