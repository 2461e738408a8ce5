"""Plan a training job: the planner's search (``PlanRequest`` -> ``PlanResult``) and the comparison of
PP + offload against a tensor-parallel baseline (``CompareTPRequest`` -> ``CompareTPResult``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeoffload.errors import FIELDS, ConfigError, Naming
from pipeoffload.planner.compare_tp import (
    BASELINES,
    Comparison,
    comparison_as_dict,
    comparison_warnings,
    format_comparison,
)
from pipeoffload.planner.compare_tp import compare_tp as compare_tp_plans
from pipeoffload.planner.emit import check_emit_setup, emit, run_keeps_plan
from pipeoffload.planner.plans import Plan, PlanRequest, SearchResult
from pipeoffload.planner.report import format_result, result_as_dict
from pipeoffload.planner.search import find_plans
from pipeoffload.service.checks import boolean, checked, one_of


@dataclass(frozen=True)
class PlanResult:
    """What ``run(PlanRequest(...))`` gives: the search's read-only ``SearchResult`` (every simulated plan,
    best first, and how many candidates were skipped for each reason); ``best()`` is the fastest plan that
    fits, ``as_dict`` is ``plan --json``'s object."""

    search: SearchResult

    @property
    def request(self) -> PlanRequest:
        return self.search.request

    def best(self) -> Plan:
        return self.search.best(1)[0]

    def as_dict(self, naming: Naming = FIELDS) -> dict[str, Any]:
        """The object ``plan --json`` prints (the top ``request.top`` plans and the Pareto frontier); its
        warnings and notes name the request's fields (``naming``: ``FLAGS`` for the command line's)."""
        return result_as_dict(self.search, self.request.top, naming)

    def text(self, pareto: bool = True, naming: Naming = FIELDS) -> str:
        """The report ``plan`` prints, naming the request's fields (``naming``: ``FLAGS`` for the flags)."""
        return format_result(self.search, self.request.top, pareto=pareto, naming=naming)

    def emit(self, path: str | Path) -> str:
        """Write the best plan as a ``pipeoffload train`` config; return the command that runs it. Of a train
        run's plans (``plan --emit``) the best whose copies the run makes (``run_keeps_plan``), as ``train
        --plan auto`` chooses: the command then says which of the plans that fit was written (its rank) and why.
        A setup train does not run (``setup.partial_recompute=True``, ``sequence_parallel=False``,
        ``selective_recompute=True``) is refused, as ``plan --emit`` refuses its flags (``check_emit_setup``)."""
        check_emit_setup(self.request.setup)
        plan = self.best()
        if self.request.model.blocks and not run_keeps_plan(self.request, plan):
            plan = next((p for p in self.search.fitting if run_keeps_plan(self.request, p)), plan)
        command = emit(self.request, plan, path)
        if plan is not self.best():  # its rank among the plans that fit: the table may show fewer (--top, --json)
            fitting = self.search.fitting
            command += (f" (plan #{fitting.index(plan) + 1} of the {len(fitting)} that fit, {plan.layout} "
                        f"{plan.choice.label()}: the run's copy lane would not make the copies the better plans' "
                        "memory counts on)")
        return command


def plan(req: PlanRequest) -> PlanResult:
    """The fastest plans that fit the budget (``InfeasibleError``, a ``ConfigError``, when none does)."""
    return PlanResult(find_plans(req))


@dataclass(frozen=True)
class CompareTPRequest:
    """PP + offload on TP 1 against a tensor-parallel baseline for the job of ``plan`` (``pipeoffload plan
    --compare-tp``): the same GPUs, batch and memory budget. ``run`` gives a ``CompareTPResult``."""

    plan: PlanRequest
    baseline: str = "tp8-interleaved"  # or "best": any TP 2-8
    match_memory: bool = False  # PP + offload may use no more activation memory than the baseline plan

    def __post_init__(self) -> None:
        if not isinstance(self.plan, PlanRequest):
            raise ConfigError(f"plan={self.plan!r}: give the PlanRequest whose job to compare, "
                              "e.g. CompareTPRequest(PlanRequest(model=..., ...))")
        checked("baseline", one_of, self.baseline, BASELINES)
        checked("match_memory", boolean, self.match_memory)


@dataclass(frozen=True)
class CompareTPResult:
    """What ``run(CompareTPRequest(...))`` gives: the best PP + offload plan on TP 1 beside the tensor-parallel
    baseline (``comparison``); ``as_dict`` is ``plan --compare-tp --json``'s object."""

    request: CompareTPRequest
    comparison: Comparison

    @property
    def warnings(self) -> list[str]:
        """The request's notes and each side's MFU warning when it is predicted above the best published
        figure, naming the request's fields (the command line prints ``in_words(w, FLAGS)`` of each)."""
        return comparison_warnings(self.comparison, self.request.plan)

    def as_dict(self, naming: Naming = FIELDS) -> dict[str, Any]:
        """The object ``plan --compare-tp --json`` prints (``naming``: ``FLAGS``)."""
        return comparison_as_dict(self.comparison, self.request.plan, naming)

    def text(self, naming: Naming = FIELDS) -> str:
        """The comparison ``plan --compare-tp`` prints (``naming``: ``FLAGS``)."""
        return format_comparison(self.comparison, self.request.plan, naming)

    def emit(self, path: str | Path) -> str | None:
        """Write the PP + offload plan as a train config (None when no such plan fits); a setup train does not
        run is refused, as by ``PlanResult.emit``."""
        check_emit_setup(self.request.plan.setup)
        pp = self.comparison.pp
        return None if pp is None else emit(self.request.plan, pp, path)


def compare_tp(req: CompareTPRequest) -> CompareTPResult:
    """PP + offload on TP 1 against the baseline, with the same GPUs, batch and budget."""
    return CompareTPResult(req, compare_tp_plans(req.plan, req.baseline, match_memory=req.match_memory))
