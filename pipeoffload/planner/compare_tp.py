"""PP + offload against tensor parallelism, on the same GPUs, global batch and memory budget.

The paper's claim ("PP with offload: up to 19 % faster than TP with even lower memory") compares
pipeline parallelism with activation offload (TP = 1) against Megatron's interleaved 1F1B with TP8 and
sequence parallelism. ``compare_tp`` runs two planner searches and reports both plans:

- ``pp``: the fastest TP = 1 plan (any schedule, offload and recompute policies);
- the baseline: ``tp8-interleaved`` (TP = 8, interleaved 1F1B, or 1F1B when the pipeline has one
  rank, no offload, recompute only where nothing else fits) or ``best`` (the fastest plan with
  2 <= TP <= 8, any schedule and policy). Outputs name the baseline as it ran
  (``Comparison.baseline_label``): a TP8 plan that does not interleave is not called interleaved.

Activation memory is the paper's metric: peak minus memory at iteration start, i.e. the worst rank's
simulated activation peak (``Plan.memory.activations``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeoffload.errors import FIELDS, ConfigError, Naming, in_words
from pipeoffload.planner.plans import GIB, InfeasibleError, Plan, PlanRequest
from pipeoffload.planner.published import mfu_warning
from pipeoffload.planner.report import offload_label
from pipeoffload.planner.search import find_plans

BASELINES = ("tp8-interleaved", "best")


@dataclass(frozen=True)
class Comparison:
    baseline: str
    pp: Plan | None  # None: no TP = 1 plan fits
    tp: Plan | None  # None: no baseline plan fits
    pp_error: str = ""  # why no plan fits (``Worded``: in the request's fields, and in the flags)
    tp_error: str = ""

    @property
    def speedup(self) -> float | None:
        """PP + offload throughput / baseline throughput (> 1: PP + offload is faster)."""
        if self.pp is None or self.tp is None:
            return None
        return self.pp.tokens_per_second / self.tp.tokens_per_second

    @property
    def baseline_label(self) -> str:
        """The baseline as it ran: ``tp8-interleaved`` only when its plan interleaves (a one-rank
        pipeline cannot, so TP8 then runs 1F1B and is named so)."""
        plan = self.tp
        if self.baseline != "tp8-interleaved" or plan is None or plan.choice.family == "interleaved-1f1b":
            return self.baseline
        if plan.layout.pp == 1:
            return f"tp8 ({plan.choice.family}: interleaving needs PP > 1)"
        return f"tp8 ({plan.choice.family}: the fastest TP8 plan that fits)"


def baseline_request(req: PlanRequest, baseline: str) -> PlanRequest:
    if baseline == "tp8-interleaved":
        return replace(req, tp_sizes=(8,), schedules=("interleaved-1f1b", "1f1b"), offload=("none",),
                       recompute=("none", "all"), best_per_tp=False)
    if baseline == "best":
        return replace(req, tp_sizes=tuple(t for t in (2, 4, 8) if t <= req.hardware.gpus_per_node),
                       best_per_tp=False)
    raise ConfigError.named(lambda n: f"{n.given('baseline', repr(baseline))}: use one of {', '.join(BASELINES)}")


def pp_request(req: PlanRequest) -> PlanRequest:
    return replace(req, tp_sizes=(1,), best_per_tp=False)


def _best(req: PlanRequest) -> tuple[Plan | None, str]:
    try:
        return find_plans(req).best(1)[0], ""
    except InfeasibleError as err:  # shown in the comparison's text and dict, in both namings
        return None, err.worded()


def compare_tp(req: PlanRequest, baseline: str = "tp8-interleaved", match_memory: bool = False) -> Comparison:
    """The best TP = 1 plan and the best ``baseline`` plan for the same request. ``match_memory``
    limits every rank's activation peak in the TP = 1 search to the baseline plan's largest one
    (``Plan.activation_peak``; the paper's "faster with even lower memory" asks for both at once)."""
    base = baseline_request(req, baseline)
    if baseline == "tp8-interleaved" and (req.gpus % 8 or req.model.heads % 8 or req.model.num_kv_heads % 8):
        raise ConfigError.named(lambda n: f"{n.given('baseline', 'tp8-interleaved')} needs GPUs ({req.gpus}), heads "
                                f"({req.model.heads}) and KV heads ({req.model.num_kv_heads}) divisible by 8; use "
                                f"{n.given('baseline', 'best')}")
    tp, tp_err = _best(base)
    pp_req = pp_request(req)
    if match_memory and tp is not None:
        pp_req = replace(pp_req, activation_budget=tp.activation_peak)
    pp, pp_err = _best(pp_req)
    if pp is None and pp_req.activation_budget is not None:
        pp_err = (f"no TP = 1 plan keeps its activation peak within the baseline's "
                  f"{pp_req.activation_budget / GIB:.2f} GiB on every rank")
    return Comparison(baseline, pp, tp, pp_err, tp_err)


def _describe(plan: Plan) -> str:
    c = plan.choice
    parts = [str(plan.layout), c.family, f"v={c.stages_per_rank}"]
    if c.group_size is not None:
        parts.append(f"g={c.group_size}")
    parts += [f"offload={offload_label(plan, plan.unit_bytes)}", f"recompute={c.recompute}", f"m={plan.microbatches}"]
    return " ".join(parts)


def format_comparison(cmp: Comparison, req: PlanRequest, naming: Naming = FIELDS) -> str:
    """The comparison's table; a side that does not fit says why in ``naming``'s names (``FLAGS``: the CLI's)."""
    model, hw = req.model, req.hardware
    lines = [f"{model.name} ({model.params_size()}, seq {model.seq}) on {req.gpus} x {hw.name} "
             f"({hw.network}); global batch {req.global_batch}; budget {req.memory_budget / GIB:.1f} GiB/GPU",
             ""]
    rows = (("PP + offload", cmp.pp, cmp.pp_error), (f"baseline {cmp.baseline_label}", cmp.tp, cmp.tp_error))
    w = max(26, *(len(label) for label, _, _ in rows))
    lines[1] = (f"{'plan':<{w}} {'tokens/s':>10} {'MFU':>6} {'act GiB':>8} {'total GiB':>9} {'host GiB':>8}  "
                "layout and schedule")
    for label, plan, err in rows:
        if plan is None:
            lines.append(f"{label:<{w}} does not fit: {in_words(err, naming)}")
            continue
        mem = plan.memory
        lines.append(f"{label:<{w}} {plan.tokens_per_second:>10,.0f} {plan.mfu:>6.1%} {plan.activation_peak / GIB:>8.1f} "
                     f"{mem.total / GIB:>9.1f} {mem.host / GIB:>8.1f}  {_describe(plan)}")
    if cmp.speedup is not None and cmp.pp is not None and cmp.tp is not None:
        act = cmp.pp.activation_peak / max(cmp.tp.activation_peak, 1.0)
        lines.append(f"PP + offload / baseline: throughput x{cmp.speedup:.3f} ({cmp.speedup - 1:+.1%}), "
                     f"activation memory x{act:.2f}")
    return "\n".join(lines)


def comparison_warnings(cmp: Comparison, req: PlanRequest) -> list[str]:
    """The model's note where its parameter count is approximate (``ModelSpec.params_note``) and the MFU
    warning (``published.mfu_warning``) of each side whose prediction is above every published run (a note
    naming what was set is ``Worded``, as ``PlanRequest.notes``)."""
    out = req.notes()
    for side, plan in (("PP + offload", cmp.pp), ("baseline", cmp.tp)):
        warning = mfu_warning(req.hardware, req.model, plan.mfu) if plan is not None else None
        if warning:
            out.append(f"{side}: {warning}")
    return out


def comparison_as_dict(cmp: Comparison, req: PlanRequest | None = None, naming: Naming = FIELDS) -> dict:
    """The object ``plan --compare-tp --json`` prints (``naming``: ``FLAGS``; errors and warnings name so)."""
    return {"baseline": cmp.baseline_label, "baseline_option": cmp.baseline, "pp": cmp.pp.as_dict() if cmp.pp else None,
            "tp": cmp.tp.as_dict() if cmp.tp else None, "speedup": cmp.speedup,
            "activation_peak_gib": {side: plan.activation_peak / GIB if plan else None
                                    for side, plan in (("pp", cmp.pp), ("tp", cmp.tp))},
            "pp_error": in_words(cmp.pp_error, naming) or None, "tp_error": in_words(cmp.tp_error, naming) or None} | (
        {"warnings": [in_words(w, naming) for w in comparison_warnings(cmp, req)]} if req is not None else {})
