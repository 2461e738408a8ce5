"""Cost one exact layout, no search: the planner's ``EstimateRequest`` -> ``EstimateResult``.

"What does my current Megatron config do, and what would PipeOffload change?": the step time, MFU,
memory per rank and where the time goes (``planner.estimate``). A layout that does not fit the memory
budget still gets its answer, marked ``fits: false``; bad input raises ``ConfigError`` in one line.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeoffload.planner.estimate import Estimate, EstimateRequest
from pipeoffload.planner.estimate import estimate as estimate_layout
from pipeoffload.planner.hardware import GIB
from pipeoffload.service.checks import check_finite, check_model_shape


@dataclass(frozen=True)
class EstimateResult:
    estimate: Estimate

    @property
    def request(self) -> EstimateRequest:
        return self.estimate.request

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.estimate.warnings

    def as_dict(self) -> dict:
        """The object ``estimate --json`` prints."""
        return self.estimate.as_dict()

    def text(self) -> str:
        e, r = self.estimate, self.request
        return "\n".join([
            f"{r.model.name} on {r.layout.gpus} x {r.hardware.name}: TP{r.tp} PP{r.pp} DP{r.dp}, {r.schedule} "
            f"v={r.stages_for()}, microbatch {r.model.microbatch} x {e.microbatches}, recompute {r.recompute}",
            f"step {e.step_seconds:.3f} s   MFU {e.mfu:.1%}   {e.tflops_per_gpu:.1f} TFLOP/s per GPU   "
            f"{e.tokens_per_second:,.0f} tokens/s",
            f"memory: worst rank {e.memory_worst / GIB:.1f} GiB of {r.budget / GIB:.1f} GiB "
            f"({'fits' if e.fits else 'DOES NOT FIT'}); per rank "
            + " ".join(f"{x / GIB:.1f}" for x in e.memory_per_rank)
            + (f"; host {e.host_bytes / GIB:.1f} GiB" if e.host_bytes else ""),
            "time on the busiest rank: " + ", ".join(
                f"{k.replace('_', ' ')} {v:.3f} s ({v / e.step_seconds:.1%})" for k, v in e.breakdown.items())])


def estimate(req: EstimateRequest) -> EstimateResult:
    """The cost of ``req``'s layout and schedule, whether or not it fits the budget."""
    check_model_shape(req.model)
    result = EstimateResult(estimate_layout(req))
    check_finite(result.as_dict(), "the estimate")
    return result
