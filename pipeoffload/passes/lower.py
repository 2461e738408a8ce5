"""``lower``: the one place lowering passes are chained, top to bottom.

    validate -> recompute (first:K) -> offload placement -> [recompute auto -> offload again]
             -> SEND/RECV -> validate

Recompute comes first because R changes the compute timeline the offload pass plans against;
``recompute auto`` needs the offload result, so it inserts its R actions and the offload pass runs
once more on the new timeline (excluding the recomputed activations).
"""
from __future__ import annotations

from pipeoffload.costs import CostModel
from pipeoffload.ir import ActionKind, Schedule
from pipeoffload.passes.comms import add_comms
from pipeoffload.passes.offload import OffloadReport, plan_offload
from pipeoffload.passes.recompute import auto_keys, check_policies, first_stage_keys, insert_recompute
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.simulate import simulate
from pipeoffload.validate import validate

K = ActionKind


def lower(schedule: Schedule, costs: CostModel | None = None, *, offload: OffloadPolicy | str = "none",
          recompute: RecomputePolicy | str = "none", check: bool = True) -> Schedule:
    """Compute-only schedule -> executable schedule: recompute, offload/reload, then SEND/RECV.

    ``costs`` should already carry the recompute policy's partial recomputation (see
    ``RecomputePolicy.apply_to``) if the result is simulated; lowering applies it for planning.
    """
    return lower_with_report(schedule, costs, offload=offload, recompute=recompute, check=check)[0]


def lower_with_report(schedule: Schedule, costs: CostModel | None = None, *,
                      offload: OffloadPolicy | str = "none", recompute: RecomputePolicy | str = "none",
                      check: bool = True) -> tuple[Schedule, OffloadReport]:
    """``lower`` plus the offload pass's report (what was offloaded, what could not be hidden)."""
    offload_policy, recompute_policy = OffloadPolicy.parse(offload), RecomputePolicy.parse(recompute)
    check_policies(offload_policy, recompute_policy)
    costs = recompute_policy.apply_to(costs or CostModel())
    base = schedule.compute_only()
    if check:
        validate(base)
    recomputed: set[tuple[int, int]] = set()
    if recompute_policy.kind == "first":
        recomputed = first_stage_keys(base, simulate(base, costs), costs, recompute_policy.count, offload_policy)
        base = insert_recompute(base, recomputed)
    timeline = simulate(base, costs) if offload_policy.kind != "none" else None
    planned, report = plan_offload(base, costs, offload_policy, exclude=recomputed, timeline=timeline)
    if recompute_policy.kind == "auto":
        offloaded = {(a.stage, a.microbatch) for row in planned.actions for a in row if a.kind is K.OFFLOAD}
        extra = auto_keys(base, timeline, costs, report, offloaded)  # type: ignore[arg-type]
        if extra:
            recomputed |= extra
            base = insert_recompute(base, extra)
            planned, report = plan_offload(base, costs, offload_policy, exclude=recomputed)
    if recomputed:
        report = OffloadReport(report.policy, report.per_rank, report.budget, str(recompute_policy),
                               tuple(sorted(recomputed)), report.notes)
    lowered = add_comms(planned)
    if check:
        validate(lowered)
    return lowered, report
