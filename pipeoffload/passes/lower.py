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
from pipeoffload.passes.offload import OffloadReport, plan_offload, planned_figures
from pipeoffload.passes.recompute import all_keys, auto_keys, check_policies, first_stage_keys, insert_recompute
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.semantics import with_coded
from pipeoffload.simulator import Figures, Timeline, simulate
from pipeoffload.units import counted
from pipeoffload.validation import validate

log = logging.getLogger(__name__)
K = ActionKind
Key = tuple[int, int]

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



def copies_made(schedule: Schedule, offload: OffloadPolicy | str, recompute: RecomputePolicy | str,
                offload_ratio: float) -> tuple[int, int]:
    """(activation windows the copy lane takes off the device at ``offload_ratio``, windows instant copies
    would) for ``schedule`` lowered against one forward per stage, as ``train`` lowers its run: where the
    first is smaller, the run keeps activations on the device that a plan with instant copies would not."""
    def moved(k: float) -> int:
        costs = CostModel().with_offload_ratio(k) if k else None
        report = lower_with_report(schedule, costs, offload=offload, recompute=recompute, log_warnings=False)[1]
        return int(report.offloaded + report.offloaded_after_i)

    return moved(offload_ratio), moved(0.0)

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
        extra, notes = _auto_keys(base, timeline, costs, offload, memo)
        if extra:
            recomputed |= extra
            base = insert_recompute(base, extra)
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


def _auto_keys(base: Schedule, timeline: Timeline, costs: CostModel, offload: OffloadPolicy,
               memo: Memo) -> tuple[set[Key], tuple[str, ...]]:
    """What ``recompute auto`` recomputes in the compute-only ``base`` (simulated as ``timeline``), and
    the report's notes (why nothing, where the recomputation would not lower the memory the plan needs).

    What to recompute is read from the offload plan for the real copy times (its unhidden list, or
    under ``budget:X`` its memory curve above X; a plan for faster copies counts both at its own times),
    then the offload is planned again without those activations. Under ``budget:X`` the curve of the
    budget's own plan is read first; the budget's fewest copies leave more above X the larger X is, so
    a larger X could recompute more, and recompute what lengthens the step more (Llama-3-8B, PP8
    group-interleaved v=4 g=4 on H100s: 33,340 tokens/s for X = 9.138 units against 33,537 for 8.72).
    So the curve of ``offload auto``'s plan, the same for every X, is read too (``_other_keys``), and
    its choice kept where it gives a shorter step for no more memory."""
    keys = _keys_read(base, timeline, costs, offload, offload, memo)
    if not keys:
        return keys, ()
    notes = _unpaid_recompute(base, insert_recompute(base, keys), costs, offload, keys, memo)
    if notes:
        return set(), notes
    return _other_keys(base, timeline, costs, offload, keys, memo) or keys, ()


def _keys_read(base: Schedule, timeline: Timeline, costs: CostModel, offload: OffloadPolicy, reading: OffloadPolicy,
               memo: Memo) -> set[Key]:
    """``recompute auto``'s choice for ``offload`` read from the plan of ``reading`` (real copy times)."""
    planned, report = _offload_once(base, costs, reading, set(), memo, faster_copies=False)
    offloaded = {(a.stage, a.microbatch) for row in planned.actions for a in row if a.kind is K.OFFLOAD}
    target = offload.budget_units(base.stages_per_rank) if offload.kind == "budget" else None
    return auto_keys(base, timeline, costs, report, offloaded, target)


def _other_keys(base: Schedule, timeline: Timeline, costs: CostModel, offload: OffloadPolicy, keys: set[Key],
                memo: Memo) -> set[Key] | None:
    """Under ``budget:X``, the activations above X in ``offload auto``'s plan (its fewest copies for the
    lowest peak the lane can hide: one plan for every X, kept in the memo), where recomputing them
    instead of ``keys`` gives a shorter step (R runs on the compute lane; the copies never delay it) and
    the offload planned again after them needs no more memory (``_worst_memory``); else None."""
    if offload.kind != "budget":
        return None
    other = _keys_read(base, timeline, costs, offload, replace(offload, kind="auto", budget=0.0, rank_units=False),
                       memo)
    if not other or other == keys:
        return None
    with_other, with_keys = insert_recompute(base, other), insert_recompute(base, keys)
    if memo(simulate, with_other, costs).makespan >= memo(simulate, with_keys, costs).makespan - 1e-12:
        return None
    memory = [_worst_memory(planned_figures(_offload_once(s, costs, offload, set(r), memo)[0], costs, memo), offload)
              for s, r in ((with_other, other), (with_keys, keys))]
    return other if memory[0] <= memory[1] + 1e-9 else None


def _unpaid_recompute(base: Schedule, with_r: Schedule, costs: CostModel, offload: OffloadPolicy,
                      extra: set[tuple[int, int]], memo: Memo) -> tuple[str, ...]:
    """The report's note where ``recompute auto``'s ``extra`` activations (recomputed in ``with_r``) do not
    lower the memory the plan needs, the worst rank's simulated activation peak plus its
    ``rank_offsets`` with the offload planned again; empty where they do. Recomputing makes the step
    longer, and the activations the lane could not hide are often not what sets the worst rank's peak
    (the I -> W parts W still needs, the last ranks of zero-bubble schedules)."""
    without, _ = _offload_once(base, costs, _alone(offload), set(), memo)
    recomputing, _ = _offload_once(with_r, costs, offload, set(extra), memo)
    before, after = (_worst_memory(planned_figures(s, costs, memo), offload) for s in (without, recomputing))
    if after < before - 1e-9:
        return ()
    return (f"none recomputed: the {len(extra)} activations recompute auto would recompute do not lower "
            f"the peak ({before:g} -> {after:g} activation units with them)",)


def _alone(offload: OffloadPolicy) -> OffloadPolicy:
    """The offload policy as it is planned without ``recompute auto``: a search gives ``recompute auto``
    the ranks' offsets to judge its recomputation by, and its offload-only twin none (unless under a
    stall budget, which plans by them), so the two share one plan in the memo."""
    return offload if offload.max_stall > 0 else replace(offload, rank_offsets=())


def _worst_memory(figures: Figures, offload: OffloadPolicy) -> float:
    """The worst rank's activation peak plus what it holds besides (``OffloadPolicy.rank_offsets``), from
    a planned schedule's simulation (``planned_figures``)."""
    peaks = figures.peak_activation_units
    offsets = offload.rank_offsets or (0.0,) * len(peaks)
    return max(offsets[r] + peak for r, peak in enumerate(peaks))
