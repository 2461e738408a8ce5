"""The built-in families and their facts, in one table (registered by ``schedules`` on first use)."""
from __future__ import annotations

from pipeoffload.errors import Worded
from pipeoffload.schedules import ScheduleSpec
from pipeoffload.schedules.classic import gpipe, interleaved_1f1b, one_f_one_b
from pipeoffload.schedules.dualpipe import dualpipe_v
from pipeoffload.schedules.group_interleaved import default_group_size, group_interleaved
from pipeoffload.schedules.v_shape import one_f_one_b_v, v_half, v_min, zb_v
from pipeoffload.schedules.zero_bubble import zb, zb_h1, zb_h2


def _every_microbatch(d: int, m: int, g: int | None) -> int | None:
    return 1


def _one_round(d: int, m: int, g: int | None) -> int | None:
    return d if m % d == 0 else None  # otherwise its rounds change shape with m


def _one_group(d: int, m: int, g: int | None) -> int | None:
    return g


def _d_microbatches(d: int, m: int, g: int | None) -> int | None:
    return d  # these families settle only after about two such periods (warmup_periods=2)


def _group_sizes(d: int) -> tuple[int | None, ...]:
    return tuple(sorted({default_group_size(d), d}))


_V = dict(placement="v", stages_per_rank=2, fixed_stages_per_rank=True, period=_d_microbatches, warmup_periods=2)

BUILTIN: tuple[ScheduleSpec, ...] = (
    ScheduleSpec("gpipe", gpipe, "all forwards, then all backwards; memory grows with microbatches (peak m)",
                 torch_class="GPipe"),
    ScheduleSpec("1f1b", one_f_one_b,
                 "one-forward-one-backward (PipeDream-flush); rank r holds at most d-r microbatches",
                 fixed_stages_per_rank=True, period=_every_microbatch, torch_class="1F1B"),
    ScheduleSpec("interleaved-1f1b", interleaved_1f1b,
                 "Megatron interleaved 1F1B: v stages per rank in a loop, bubble / v, peak at most d+(d-1)/v rank "
                 "units (1F1B's d and (d-1)/v more)",
                 aliases=("interleaved",), stages_per_rank=2, interleaved=True, period=_one_round,
                 torch_class="Interleaved1F1B"),
    ScheduleSpec("dualpipe-v", dualpipe_v,
                 "DualPipeV: V placement, forward/backward pairs (overlapped in MoE runtimes), d+1/2 rank units",
                 backward="mixed", torch_class="DualPipeV", **_V),  # type: ignore[arg-type]
    ScheduleSpec("zb-h1", zb_h1,
                 "zero bubble H1: 1F1B's peak memory (d rank units), W deferred into the bubbles; bubble ~1/3 of 1F1B's",
                 aliases=("zb1p",), backward="split", period=_d_microbatches, warmup_periods=2,
                 torch_class="InterleavedZeroBubble"),
    ScheduleSpec("zb-h2", zb_h2, "zero bubble H2: about twice 1F1B's memory (2d rank units), near-zero bubble",
                 fixed_stages_per_rank=True, backward="split", period=_d_microbatches, warmup_periods=2),
    ScheduleSpec("zb", zb,
                 "memory-limited zero bubble: greedy W filling under a per-rank activation limit and a cost model",
                 aliases=("zb-auto",), fixed_stages_per_rank=True, backward="split",
                 options=("memory_limit", "costs")),
    ScheduleSpec("v-half", v_half,
                 "V-shape controllable memory: floor((d+2)/2) rank units, about half of 1F1B's, small bubble",
                 backward="split", options=("costs",), **_V),  # type: ignore[arg-type]
    ScheduleSpec("v-min", v_min, "V-shape controllable memory: floor((d+4)/3) rank units, a third of 1F1B's as d grows (half at d=8)",
                 backward="split", options=("costs",), **_V),  # type: ignore[arg-type]
    ScheduleSpec("zb-v", zb_v, "zero bubble V: 1F1B's memory (d rank units), near-zero bubble, twice the P2P traffic",
                 aliases=("zbv",), backward="split", options=("costs",), torch_class="ZBVZeroBubble",
                 **_V),  # type: ignore[arg-type]
    ScheduleSpec("1f1b-v", one_f_one_b_v,
                 "1F1B on V placement (full backward, no I/W split): 1F1B's memory, bubble between 1F1B and ZB-V",
                 **_V),  # type: ignore[arg-type]
    ScheduleSpec("group-interleaved", group_interleaved,
                 Worded.named(lambda n: "PipeOffload's interleaved 1F1B: g microbatches pass each stage back to "
                              "back; peak g(v-1)+d activation units ((g(v-1)+d)/v rank units), I/W split (or "
                              f"{n.given('backward', 'full')})"),
                 aliases=("pipeoffload",), stages_per_rank=2, interleaved=True, backward="option",
                 options=("group_size", "backward"), period=_one_group, group_sizes=_group_sizes),
)
