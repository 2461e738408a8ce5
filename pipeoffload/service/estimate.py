"""Cost one exact layout, no search: the planner's ``EstimateRequest`` -> ``EstimateResult``.

"What does my current Megatron config do, and what would PipeOffload change?": the step time, MFU,
memory per rank and where the time goes (``planner.estimate``). A layout that does not fit the memory
budget still gets its answer, marked ``fits: false``; bad input raises ``ConfigError`` in one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeoffload.errors import FIELDS, Naming
from pipeoffload.planner.estimate import Estimate, EstimateRequest
from pipeoffload.planner.estimate import estimate as estimate_layout
from pipeoffload.planner.hardware import GIB, gib
from pipeoffload.service.checks import check_finite


@dataclass(frozen=True)
class EstimateResult:
    """What ``run(EstimateRequest(...))`` gives: the ``planner.estimate.Estimate`` of the one layout (step time,
    MFU, memory per GPU, whether it fits, its read-only ``breakdown``); ``as_dict`` is ``estimate --json``'s."""

    estimate: Estimate

    @property
    def request(self) -> EstimateRequest:
        return self.estimate.request

    @property
    def warnings(self) -> tuple[str, ...]:
        """Warnings naming the request's fields; the command line prints ``in_words(w, FLAGS)`` of each."""
        return self.estimate.warnings

    def as_dict(self, naming: Naming = FIELDS) -> dict[str, Any]:
        """The object ``estimate --json`` prints (``naming``: ``FLAGS``)."""
        return self.estimate.as_dict(naming)

    def text(self, naming: Naming = FIELDS) -> str:
        """The report ``estimate`` prints (``naming``: ``FLAGS``), its hints naming the request's fields."""
        e, r, c = self.estimate, self.request, self.estimate.planned
        offload = f"offload {_offload(e, naming)}" + (" with LGD partial recomputation" if e.partial_recompute else "")
        policy = f", recompute policy {c.recompute}" if str(c.recompute) != "none" else ""
        group = f" g={c.group_size}" if c.group_size is not None else ""
        return "\n".join([
            f"{r.model.name} ({r.model.params_size()} params) on "
            f"{r.layout.gpus} x {r.hardware.name}: TP{r.tp} PP{r.pp} DP{r.dp}, {r.schedule} "
            f"v={r.stages_for()}{group}, seq {r.model.seq:,}, microbatch {r.model.microbatch} x {e.microbatches}, "
            f"recompute {r.recompute}{policy}, {offload}", *_split_line(e),
            f"step {seconds(e.step_seconds)}   MFU {e.mfu:.1%}   {e.tflops_per_gpu:.1f} TFLOP/s per GPU   "
            f"{e.tokens_per_second:,.0f} tokens/s   pipeline bubble {e.bubble_ratio:.1%} (idle share of all "
            "ranks, as plan's bubble column)" + _imbalance(e, naming),
            f"memory: worst rank {gib(e.memory_worst)} GiB of {r.budget / GIB:.1f} GiB "
            f"({'fits' if e.fits else 'DOES NOT FIT'}); per rank "
            + " ".join(gib(x) for x in e.memory_per_rank)
            + (f"; host {gib(e.host_bytes)} GiB" if e.host_bytes else ""),
            "time on the busiest rank (share of the step): " + ", ".join(
                f"{_LABELS.get(k, k.replace('_', ' '))} {seconds(v)} ({v / e.step_seconds:.1%})"
                for k, v in e.breakdown.items())])


def _offload(e: Estimate, n: Naming) -> str:
    """The offload policy simulated: a stall budget as plan's column writes it (``auto+5%``), and the
    target ``budget`` was given (what the memory budget leaves, as plan fills it)."""
    policy, r = e.planned.offload, e.request
    stall = f"+{policy.max_stall:g}%" if policy.max_stall > 0 else ""
    if r.offload_text == "budget":
        left = gib(policy.budget * e.unit_bytes)
        return f"{policy}{stall} ({left} GiB: what {n('memory_budget')} leaves for activations)"
    return f"{policy}{stall}"


def _split_line(e: Estimate) -> list[str]:
    """How the layers were split, when the stages do not all hold the same number."""
    split = e.layers_per_stage
    if len(set(split)) <= 1:
        return []
    r = e.request
    how = ("as given" if r.layers_per_stage is not None else "balanced: the head weighed" if r.split == "balanced"
           else "uneven: the remainder on the earliest stages")
    return [f"layers per stage {','.join(map(str, split))} ({how})"]


def _imbalance(e: Estimate, n: Naming) -> str:
    """What of the bubble uneven stage loads cause, when it is worth a line (and, on an even split,
    the split that weighs the embedding and the head, in ``n``'s names). The ranks' busy time holds the TP collectives
    inside their layers, which the breakdown lists apart (``tp_comm``): with TP the line says so."""
    share = e.imbalance_ratio
    if share < _IMBALANCE_NOTED:
        return ""
    busy = e.busy_seconds
    hint = f"; {n.given('split', 'balanced')} weighs the embedding and the head" if (
        e.request.split == "even" and e.request.layers_per_stage is None) else ""
    what = (f"is busy {seconds(max(busy))} (compute and TP communication)" if e.request.tp > 1
            else f"computes {seconds(max(busy))}")
    return (f"\n  of it {100 * share:.1f} points from uneven stage loads: the busiest rank {what}, "
            f"the mean rank {seconds(sum(busy) / len(busy))}{hint}")


_IMBALANCE_NOTED = 0.01  # a share of the step below which uneven loads are not worth a line


# the busiest rank's idle time is not the pipeline's bubble ratio (plan's column, the step line's figure)
_LABELS = {"bubble": "its bubble"}


def seconds(value: float) -> str:
    """A duration with enough digits not to read 0 for a small model: seconds down to 10 ms, then ms or us."""
    if value == 0 or abs(value) >= 0.01:
        return f"{value:.3f} s"
    if abs(value) >= 1e-5:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


def estimate(req: EstimateRequest) -> EstimateResult:
    """The cost of ``req``'s layout and schedule, whether or not it fits the budget."""
    result = EstimateResult(estimate_layout(req))
    check_finite(result.as_dict(), "the estimate")
    return result
