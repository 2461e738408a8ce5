"""``lower``: the one place lowering passes are chained, top to bottom.

    validate -> recompute (first:K, all) -> offload placement -> [recompute auto -> offload again]
             -> SEND/RECV -> validate

Recompute comes first because R changes the compute timeline the offload pass plans against;
``recompute auto`` needs the offload result, so it inserts its R actions and the offload pass runs
once more on the new timeline (excluding the recomputed activations).
"""
from __future__ import annotations

import logging
from dataclasses import replace

from pipeoffload._perf import Memo, gc_paused
from pipeoffload.costs import CostModel, require_costs
from pipeoffload.errors import ConfigError
from pipeoffload.intervals import EPS
from pipeoffload.ir import COMM_KINDS, ActionKind, Schedule, require_schedule
from pipeoffload.passes.comms import add_comms
from pipeoffload.passes.offload import OffloadReport, plan_offload
from pipeoffload.passes.recompute import all_keys, auto_keys, check_policies, first_stage_keys, insert_recompute
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.semantics import with_coded
from pipeoffload.simulator import Timeline, simulate
from pipeoffload.units import counted
from pipeoffload.validation import validate

log = logging.getLogger(__name__)
K = ActionKind

# The memory policies ``lower`` takes, declared rather than read from its signature (a wrapper
# without functools.wraps would hide them from the planner).
POLICIES = ("offload", "recompute")


def lower(schedule: Schedule, costs: CostModel | None = None, *, offload: OffloadPolicy | str = "none",
          recompute: RecomputePolicy | str = "none", check: bool = True) -> Schedule:
    """Compute-only schedule -> executable schedule: recompute, offload/reload, then SEND/RECV.

    Policies are values or their text forms (``"first:1"``, ``"budget:4"``, ``"auto,lgd"``...). When
    simulating the result, pass the same costs with the recompute policy's partial recomputation
    applied (``RecomputePolicy.apply_to``); lowering applies it for planning.
    """
    return lower_with_report(schedule, costs, offload=offload, recompute=recompute, check=check)[0]


def lower_with_report(schedule: Schedule, costs: CostModel | None = None, *,
                      offload: OffloadPolicy | str = "none", recompute: RecomputePolicy | str = "none",
                      check: bool = True, comms: bool = True, log_warnings: bool = True,
                      memo: Memo | None = None) -> tuple[Schedule, OffloadReport]:
    """``lower`` plus the offload pass's report (what was offloaded, what could not be hidden).

    ``comms=False`` stops before SEND/RECV (the simulator times a schedule without them the same way).
    The report's ``warnings`` hold what the passes could not do (e.g. a budget not met); they are also
    logged unless ``log_warnings`` is False (a search collects them in its own report instead).
    ``memo``: a search that lowers several policies of one schedule passes its own, so that they share
    the schedule's simulation, its rank timelines and the first offload plan; without one the call
    keeps them only for itself.
    """
    require_schedule(schedule, "lower")
    require_costs(costs, "lower")
    with gc_paused():  # the passes allocate many small acyclic objects: no cyclic GC passes meanwhile
        return _lower(schedule, costs, offload, recompute, check, comms, log_warnings,
                      memo if memo is not None else Memo())


def _lower(schedule: Schedule, costs: CostModel | None, offload: OffloadPolicy | str, recompute: RecomputePolicy | str,
           check: bool, comms: bool, log_warnings: bool, memo: Memo) -> tuple[Schedule, OffloadReport]:
    offload_policy, recompute_policy = OffloadPolicy.parse(offload), RecomputePolicy.parse(recompute)
    check_policies(offload_policy, recompute_policy)
    costs = recompute_policy.apply_to(costs or CostModel())
    source = _memory_actions_kept(schedule, offload_policy, recompute_policy)
    if check:  # its coded form serves the validation, then ``add_comms`` or the first simulation
        source = with_coded(source)
        validate(source)
    planned, report = _memory_passes(source, costs, offload_policy, recompute_policy, memo)
    if log_warnings:
        for warning in report.warnings:
            log.warning("%s", warning)
    if not comms:
        return planned, report
    lowered = add_comms(planned)
    if check:
        validate(lowered)
    return lowered, report


def _memory_actions_kept(schedule: Schedule, offload: OffloadPolicy, recompute: RecomputePolicy) -> Schedule:
    """Drop comm actions; keep hand-placed OFFLOAD/RELOAD/R unless a policy is to place its own."""
    kinds = set(schedule.kinds())
    hand_placed = bool(kinds & {K.OFFLOAD, K.RELOAD, K.R})
    if hand_placed and (offload.kind != "none" or recompute.kind != "none"):
        raise ConfigError(
            f"offload={offload}, recompute={recompute}: the schedule already has OFFLOAD/RELOAD/R actions; "
            "pass offload='none' and recompute='none' to keep them, or lower a compute-only schedule"
        )
    if not kinds & COMM_KINDS:
        return schedule
    return schedule.with_actions([[a for a in row if a.kind not in COMM_KINDS] for row in schedule.actions])


def _offload_once(base: Schedule, costs: CostModel, offload: OffloadPolicy, recomputed: set[tuple[int, int]],
                  memo: Memo, faster_copies: bool = True) -> tuple[Schedule, OffloadReport]:
    """``plan_offload`` of ``base``, kept in ``memo``: a search lowers several policies of one schedule,
    whose offload plans are often the same."""
    exclude = frozenset(recomputed)
    return memo.get((plan_offload, base, costs, offload, exclude, faster_copies),
                    lambda: plan_offload(base, costs, offload, exclude=exclude, memo=memo,
                                         faster_copies=faster_copies))


def _memory_passes(source: Schedule, costs: CostModel, offload: OffloadPolicy,
                   recompute: RecomputePolicy, memo: Memo) -> tuple[Schedule, OffloadReport]:
    if offload.kind == "none" and recompute.kind == "none":
        return source, OffloadReport(offload)
    base = source.compute_only()
    original = memo(simulate, base, costs)  # a search lowers several policies of one schedule
    recomputed: set[tuple[int, int]] = set()
    timeline = original
    if recompute.kind in ("first", "all"):
        recomputed = (first_stage_keys(base, original, costs, recompute.count, offload) if recompute.kind == "first"
                      else all_keys(base, original, costs, offload))
        base = insert_recompute(base, recomputed)
        timeline = memo(simulate, base, costs)
    notes: tuple[str, ...] = ()
    if recompute.kind == "auto":
        planned, report, recomputed, notes = _recompute_auto(base, timeline, costs, offload, memo)
        if not recomputed:  # nothing recomputed: exactly the plan of the offload policy alone
            offload = _alone(offload)
    else:
        planned, report = _offload_once(base, costs, offload, recomputed, memo)
    before = {r.rank: r.peak_activation_units for r in original.per_rank}
    per_rank = tuple(replace(r, peak_before=before[r.rank]) for r in report.per_rank)
    report = replace(report, per_rank=per_rank, recompute=recompute, recomputed=tuple(sorted(recomputed)),
                     notes=(*report.notes, *notes))
    if report.budget_met is False and report.budget is not None:
        warning = (f"offload {offload}: cannot bring every rank to {counted(report.budget, 'activation unit')}; "
                   f"best planned peak {report.peak_after:g}")
        report = replace(report, warnings=(*report.warnings, warning))
    return planned, report


_AutoPlan = tuple[Schedule, OffloadReport, set[tuple[int, int]], tuple[str, ...]]
# ``offload budget:X`` with ``recompute auto`` where the plan misses X: tighter targets X - s, X - 2s,
# X - 4s, ... (s the overshoot, at least TIGHTER_STEP units), at most TIGHTER_DESCENT of them, until one
# plan meets its own target; then TIGHTER_BISECT halvings between that target and the last one missed
TIGHTER_STEP = 0.125
TIGHTER_DESCENT = 4
TIGHTER_BISECT = 2


def _auto_at(base: Schedule, timeline: Timeline, costs: CostModel, offload: OffloadPolicy, memo: Memo) -> _AutoPlan:
    """``recompute auto`` with ``offload``: what to recompute is read from the plan for the real copy
    times (its unhidden list and memory curve; a plan for faster copies counts both at its own times),
    then the offload is planned again without the recomputed activations. Returns the lowered schedule,
    the offload pass's report, what was recomputed and the notes (why nothing was, where it did not pay)."""
    planned, report = _offload_once(base, costs, offload, set(), memo, faster_copies=False)
    offloaded = {(a.stage, a.microbatch) for row in planned.actions for a in row if a.kind is K.OFFLOAD}
    extra = auto_keys(base, timeline, costs, report, offloaded)
    notes: tuple[str, ...] = ()
    recomputed: set[tuple[int, int]] = set()
    if extra:
        with_r = insert_recompute(base, extra)
        notes = _unpaid_recompute(base, with_r, costs, offload, extra, memo)
        if not notes:
            recomputed, base = set(extra), with_r
    planned, report = _offload_once(base, costs, offload if recomputed else _alone(offload), recomputed, memo)
    return planned, report, recomputed, notes


def _recompute_auto(base: Schedule, timeline: Timeline, costs: CostModel, offload: OffloadPolicy,
                    memo: Memo) -> _AutoPlan:
    """``recompute auto`` (``_auto_at``); under ``offload budget:X``, where that plan misses X (its planned
    peak P above X: recompute auto chose what to recompute from the plan before the recomputation, and
    the offload planned again after it does not always reach X), also the plans for tighter targets:
    X - s, X - 2s, X - 4s, ... (s = P - X, at least ``TIGHTER_STEP``; ``TIGHTER_DESCENT`` at most) until
    one meets its own target, then ``TIGHTER_BISECT`` halvings between the loosest target met and the
    tightest missed (the loosest plan that meets its target recomputes least). Of all these plans, those
    whose simulated memory fits X (the worst rank's activations plus its ``rank_offsets`` within X plus
    the largest offset: the planner's memory budget where it fills X) are compared by simulated step,
    then memory; the fastest is kept (the plan for X where none fits). So a larger target no longer keeps
    a plan that misses it and is slower than a plan for a tighter target that fits it: Llama-3-8B PP8
    group-interleaved v=4, g=4 (``tests/unit/test_planner_memory_monotone.py``): the plan for 9.138 units
    reached 9.565 with a 0.6 % longer step than the plan for 8.72 (8.62 units); it now keeps that plan."""
    first = _auto_at(base, timeline, costs, offload, memo)
    if offload.kind != "budget" or first[1].budget_met is not False:
        return first
    target = first[1].budget
    assert target is not None
    tried: dict[float, _AutoPlan] = {target: first}

    def meets(aim: float) -> bool:
        units = aim / base.stages_per_rank if offload.rank_units else aim
        tried[aim] = _auto_at(base, timeline, costs, replace(offload, budget=units), memo)
        return bool(tried[aim][1].budget_met)

    step = max(first[1].peak_after - target, TIGHTER_STEP)
    missed, met = target, None
    for k in range(TIGHTER_DESCENT):
        aim = target - step * 2 ** k
        if aim <= EPS:
            break
        if meets(aim):
            met = aim
            break
        missed = aim
    for _ in range(TIGHTER_BISECT if met is not None else 0):
        assert met is not None
        mid = (met + missed) / 2
        if meets(mid):
            met = mid
        else:
            missed = mid
    limit = target + max(offload.rank_offsets, default=0.0) + 1e-9
    scored = []
    for i, (aim, plan) in enumerate(tried.items()):
        sim = memo(simulate, plan[0], costs)  # the planner simulates the kept schedule again from the memo
        worst = _worst_memory(sim, offload)
        if worst <= limit:
            scored.append((sim.makespan, worst, i, aim))
    if not scored or min(scored)[2] == 0:
        return first
    aim = min(scored)[3]
    planned, report, recomputed, notes = tried[aim]
    note = (f"planned for {aim:.4g} activation units: the plan for {target:g} reached {first[1].peak_after:g} "
            f"with a longer step or more memory than this one, which fits {target:g}")
    report = replace(report, policy=replace(report.policy, budget=offload.budget), budget=target)
    return planned, report, recomputed, (*notes, note)


def _unpaid_recompute(base: Schedule, with_r: Schedule, costs: CostModel, offload: OffloadPolicy,
                      extra: set[tuple[int, int]], memo: Memo) -> tuple[str, ...]:
    """The report's note where ``recompute auto``'s ``extra`` activations (recomputed in ``with_r``) do not
    lower the memory the plan needs, the worst rank's simulated activation peak plus its
    ``rank_offsets`` with the offload planned again; empty where they do. Recomputing makes the step
    longer, and the activations the lane could not hide are often not what sets the worst rank's peak
    (the I -> W parts W still needs, the last ranks of zero-bubble schedules)."""
    without, _ = _offload_once(base, costs, _alone(offload), set(), memo)
    recomputing, _ = _offload_once(with_r, costs, offload, set(extra), memo)
    before, after = (_worst_memory(memo(simulate, s, costs), offload) for s in (without, recomputing))
    if after < before - 1e-9:
        return ()
    return (f"none recomputed: the {len(extra)} activations recompute auto would recompute do not lower "
            f"the peak ({before:g} -> {after:g} activation units with them)",)


def _alone(offload: OffloadPolicy) -> OffloadPolicy:
    """The offload policy as it is planned without ``recompute auto``: a search gives ``recompute auto``
    the ranks' offsets to judge its recomputation by, and its offload-only twin none (unless under a
    stall budget, which plans by them), so the two share one plan in the memo."""
    return offload if offload.max_stall > 0 else replace(offload, rank_offsets=())


def _worst_memory(timeline: Timeline, offload: OffloadPolicy) -> float:
    """The worst rank's activation peak plus what it holds besides (``OffloadPolicy.rank_offsets``)."""
    offsets = offload.rank_offsets or (0.0,) * len(timeline.per_rank)
    return max(offsets[r.rank] + r.peak_activation_units for r in timeline.per_rank)
