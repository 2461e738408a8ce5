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
        # what to recompute is read from the plan for the real copy times (its unhidden list and memory
        # curve; a plan for faster copies counts both at its own times), then the offload is planned again
        planned, report = _offload_once(base, costs, offload, recomputed, memo, faster_copies=False)
        offloaded = {(a.stage, a.microbatch) for row in planned.actions for a in row if a.kind is K.OFFLOAD}
        extra = auto_keys(base, timeline, costs, report, offloaded)
        if extra:
            with_r = insert_recompute(base, extra)
            notes = _unpaid_recompute(base, with_r, costs, offload, extra, memo)
            if not notes:
                recomputed |= extra
                base = with_r
        if not recomputed:  # nothing recomputed: exactly the plan of the offload policy alone
            offload = _alone(offload)
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
