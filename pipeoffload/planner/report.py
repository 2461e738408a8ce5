"""Text and JSON renderings of a planner search (tables of plans, the Pareto frontier, per-TP bests)."""
from __future__ import annotations

from pipeoffload.errors import FIELDS, Naming, in_words
from pipeoffload.planner.published import mfu_warning
from pipeoffload.planner.search import GIB, Plan, SearchResult

MIB = 2**20


def memory_unit(largest: float) -> tuple[str, float]:
    """The unit memory up to ``largest`` bytes is printed in: GiB, or MiB below 1 GiB, where GiB to one
    decimal read "0.0" (a small model's plans)."""
    return ("GiB", GIB) if largest >= GIB else ("MiB", MIB)


def memory_text(n: float, places: int = 1) -> str:
    """``n`` bytes as a line says them: in GiB from 1 GiB up, else in MiB (never a "0.00 GiB")."""
    name, size = memory_unit(n)
    return f"{n / size:.{places}f} {name}"


def step_unit(longest: float) -> tuple[str, float]:
    """The unit step times up to ``longest`` seconds are printed in: s, or ms below 10 ms, where seconds to
    three places read "0.000" or one digit (a small model's plans)."""
    return ("s", 1.0) if longest >= 0.01 else ("ms", 1e-3)


def _header(unit: str, step: str = "s") -> str:
    return (f"{'#':>3}  {'layout':<13} {'schedule':<17} {'v':>2} {'g':>3} {'offload':<8} {'recompute':<9} "
            f"{'m':>4} {'tokens/s':>10} {'MFU':>6} {'step ' + step:>7}  {unit + ' total = par + opt + act':<28} "
            f"{'host':>6} {'bubble':>6} {'stall':>6}")


def offload_label(plan: Plan, unit_bytes: float | None = None, unit: tuple[str, float] = ("GiB", GIB)) -> str:
    """The offload policy as shown: a ``budget:X`` target (activation units) in GiB (``unit``); ``+2%``
    under a stall budget of 2 % (``--max-stall``)."""
    offload = plan.choice.offload
    stall = f"+{offload.max_stall:g}%" if offload.max_stall > 0 else ""
    if offload.kind == "budget" and not offload.rank_units and unit_bytes:
        return f"{offload.budget * unit_bytes / unit[1]:.1f}{unit[0]}" + stall
    return str(offload) + stall


def format_plan_row(index: int, plan: Plan, unit: tuple[str, float] = ("GiB", GIB),
                    step: tuple[str, float] = ("s", 1.0)) -> str:
    c, mem, size = plan.choice, plan.memory, unit[1]
    split = (f"{mem.total / size:6.1f} = {mem.parameters / size:5.1f} + {mem.optimizer / size:4.1f} + "
             f"{mem.activations / size:5.1f}")
    return (f"{index:>3}  {str(plan.layout):<13} {c.family:<17} {c.stages_per_rank:>2} "
            f"{c.group_size if c.group_size is not None else '-':>3} {offload_label(plan, _unit(plan), unit):<8} "
            f"{str(c.recompute):<9} "
            f"{plan.microbatches:>4} {plan.tokens_per_second:>10,.0f} {plan.mfu:>6.1%} {plan.step_time / step[1]:>7.3f}  "
            f"{split:<28} {mem.host / size:>6.1f} {plan.bubble_ratio:>6.1%} {plan.stall_ratio:>6.1%}")


def _unit(plan: Plan) -> float | None:
    return plan.unit_bytes or None


def format_table(plans: list[Plan], unit: tuple[str, float] | None = None) -> str:
    """The plans' rows under their header, memory in GiB, or in MiB where every plan's total is below 1 GiB
    (``unit``: this one instead); step times in s, or in ms where every plan's step is below 10 ms."""
    unit = unit or memory_unit(max((p.memory.total for p in plans), default=GIB))
    step = step_unit(max((p.step_time for p in plans), default=1.0))
    return "\n".join([_header(unit[0], step[0])] + [format_plan_row(i + 1, p, unit, step) for i, p in enumerate(plans)])


def format_result(result: SearchResult, top: int = 5, pareto: bool = True, naming: Naming = FIELDS) -> str:
    """The report ``plan`` prints; its notes name the request's fields (``naming``: ``FLAGS`` for the flags)."""
    req = result.request
    model, hw = req.model, req.hardware
    rate = result.candidates / result.seconds if result.seconds > 0 else float("inf")
    lines = [
        f"{model.name} ({model.params_size()} params, seq {model.seq}, microbatch {model.microbatch}) "
        f"on {req.gpus} x {hw.name}; global batch {req.global_batch} sequences; "
        f"budget {memory_text(req.memory_budget)}/GPU"
        + (f", host {memory_text(req.host_memory_budget)}/GPU" if req.host_memory_budget is not None else "")
        + ("; Megatron's selective recomputation (attention core) on every plan"
           if req.setup.selective_recompute else "")
        + (f"; offload plans may lengthen the step by up to {req.max_stall:g} % ({naming('max_stall')})"
           if req.max_stall > 0 else ""),
        f"searched {result.candidates} candidates ({result.evaluated} simulated) in {_seconds(result.seconds)} s "
        f"= {rate:.0f} candidates/s" + _skipped(result),
        "",
        f"best plans that fit ({len(result.fitting)} fit):",
        format_table(result.best(top)),
    ]
    if pareto:
        lines += ["", "Pareto frontier (less memory <-> more throughput, plans that fit):",
                  format_table(result.pareto())]
    if req.best_per_tp:
        lines += ["", "best plan per tensor-parallel size:", format_table(list(result.best_by_tp().values()))]
    lines += ["", "memory is the worst rank's weights+grads (par), optimizer state (opt) and simulated activation "
              "peak (act); host is pinned host memory per GPU; stall is the worst rank's wait for reloads."]
    shown = result.best(top) + (result.pareto() if pareto else [])
    lines += link_notes(result, shown, naming)
    return "\n".join(lines)


def link_notes(result: SearchResult, shown: list[Plan], naming: Naming = FIELDS) -> list[str]:
    """What a faster or slower host link does to the shown plans that offload; the guarantee holds
    where the simulator gives each rank its own link (not the serialized pair), for plans that never
    stall (not those of a stall budget, which say what they are). ``naming``: how they name what sets them."""
    req = result.request
    notes = []
    strict = [p for p in shown if p.choice.offload.kind != "none" and p.choice.offload.max_stall == 0]
    if strict and req.setup.host_link != "serialized":
        notes.append(f"offload copies are planned for the host link's {req.hardware.d2h_bandwidth / 1e9:g} GB/s "
                     f"({naming('hardware.d2h_bandwidth')}): a faster link never raises their peak, a slower one "
                     "can stall them (docs/offload.md, 'A faster link than planned').")
    if any(p.choice.offload.max_stall > 0 for p in shown):
        notes.append(f"offload +{req.max_stall:g}%: copies planned for a faster link than the real one, so that "
                     f"the step may be up to {req.max_stall:g} % longer for a lower peak ({naming('max_stall')}; the "
                     "stall column; docs/offload.md, 'A stall budget').")
    return notes


def _skipped(result: SearchResult) -> str:
    if not result.skipped:
        return ""
    return "; skipped: " + ", ".join(f"{n} {reason}" for reason, n in sorted(result.skipped.items()))


def plan_warnings(result: SearchResult) -> list[str]:
    """The model's note where its parameter count is approximate (``ModelSpec.params_note``), and the MFU
    warning for the best plan (``published.mfu_warning``), if it is above every published run; a note that
    names what was set is ``Worded`` (the command line prints ``in_words(w, FLAGS)``)."""
    best = result.best(1)
    mfu = mfu_warning(result.request.hardware, result.request.model, best[0].mfu) if best else None
    return [*result.request.notes(), *([mfu] if mfu else [])]


def result_as_dict(result: SearchResult, top: int = 5, naming: Naming = FIELDS) -> dict:
    """The object ``plan --json`` prints (``naming``: ``FLAGS``; the warnings and notes name what was set so)."""
    req = result.request
    return {
        "model": req.model.name,
        "params": req.model.total_params(),
        "gpu": req.hardware.name,
        "gpus": req.gpus,
        "global_batch": req.global_batch,
        "memory_budget_gib": req.memory_budget / GIB,
        "candidates": result.candidates,
        "simulated": result.evaluated,
        "seconds": result.seconds,
        "skipped": dict(sorted(result.skipped.items())),
        "selective_recompute": req.setup.selective_recompute,
        "max_stall": req.max_stall,
        "warnings": [in_words(w, naming) for w in plan_warnings(result)],
        "notes": link_notes(result, result.best(top) + result.pareto(), naming),
        "best": [p.as_dict() for p in result.best(top)],
        "pareto": [p.as_dict() for p in result.pareto()],
    } | ({"best_by_tp": {str(tp): p.as_dict() for tp, p in result.best_by_tp().items()}}
         if req.best_per_tp else {})


def _seconds(seconds: float) -> str:
    """``20.3``, or ``0.047`` below a second (not ``0.0`` beside a rate of thousands per second)."""
    return f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.2g}"
