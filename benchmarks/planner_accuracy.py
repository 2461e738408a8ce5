"""Planner accuracy: ``pipeoffload estimate`` against published measurements on A100 GPUs.

Run: .venv/bin/python benchmarks/planner_accuracy.py [--save benchmarks/results/planner_accuracy.txt]
     .venv/bin/python benchmarks/planner_accuracy.py --fit   (refit the two GEMM-curve constants)
     add --before OLD.txt (an earlier results file) for a "before" column: each row's step error there

Every whole-model row runs through ``estimate`` (``pipeoffload.planner.estimate``), the function
behind ``pipeoffload estimate``, so what users run is what is checked; the per-layer rows of
Korthikanti Table 4 use ``layer_times``, the per-layer model ``estimate`` is built from.

Rows (configuration as we read the papers; what a paper does not state is marked "assumed"):
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 4:
  one layer of the 22B model (h=6144, a=64, s=2048, microbatch b=4) on 8 x A100-80GB (DGX A100,
  NVLink) with TP8 and sequence parallelism: forward 7.2 ms, forward + backward 19.0 ms.
  FITTED: the two GEMM-curve constants (``gemm_max_fraction``, ``gemm_half_intensity``) are fitted on
  these two numbers. Every other row is a CHECK, never fitted: the same table's TP8 rows without
  sequence parallelism (forward 7.7, total 19.6 ms) and with selective recomputation (20.3 ms).
- Same paper, Table 5 (selective recomputation + sequence parallelism), MFU with its Table 3 setups:
  22B (48 layers, TP8, PP1, 8 GPUs, global batch 4, microbatch 4): 41.5 %;
  175B (96 layers, h=12288, a=96, TP8, PP8, 64 GPUs, global batch 64, microbatch 1): 51.4 %; the
  pipeline schedule is not in Table 3: 1F1B assumed (Megatron's default without
  --num-layers-per-virtual-pipeline-stage). Step-time error = measured MFU / predicted MFU - 1.
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", Table 1, all ten rows (weak scaling, seq 2048, vocab 51200, full activation
  recomputation, no sequence parallelism, fp16; TFLOP/s per GPU counting the recomputation:
  96*B*s*l*h^2*(1 + s/6h + V/16lh)). Microbatch sizes and interleaving (layers per virtual stage) are
  those of the authors' scripts (Megatron-LM examples/sc21/run_table_1.sh). Selene DGX A100 nodes:
  one 200 Gb/s HDR InfiniBand NIC per GPU (the a100 preset's network). Gradients all-reduced in fp32
  after the backward, not overlapped (assumed: the scripts' fp16 without
  --accumulate-allreduce-grads-in-fp32 reduces fp16 gradients, and the PP1 rows' DDP=torch overlaps
  them; both would make those rows faster). Step-time error = measured / predicted TFLOP/s - 1.
Held back (blocks after the table, never fitted): the PTD-P rows of the same paper's Table 2 (schedule not
stated: predicted both ways) and the settings of its Figures 12 and 18 (175B on 96 GPUs, interleaved against
1F1B, scatter/gather on and off), whose bars have no values: set beside what its text says of them.
All rows: Megatron's fused (not flash) attention, dropout on, 2-byte activations, tied word
embeddings (Megatron's GPT: the head reuses the embedding, whose gradient the first and last stage
all-reduce), no distributed optimizer, and Megatron's blocking batched point-to-point exchanges (``p2p="megatron"``, see
``planner/exchange.py``).
"""
from __future__ import annotations

import argparse
import itertools
import re
import shlex
import sys
from dataclasses import dataclass, fields, replace

from pipeoffload.fileio import write_atomic
from pipeoffload.planner.candidates import embedding_sync_time, optimizer_step_time
from pipeoffload.planner.estimate import Estimate, EstimateRequest, _plan_request, estimate
from pipeoffload.planner.exchange import megatron_order, megatron_steps
from pipeoffload.planner.hardware import HardwareSpec, hardware_preset
from pipeoffload.planner.layertime import layer_times
from pipeoffload.planner.model import ModelSpec
from pipeoffload.schedules import generate

TOLERANCE = 0.05  # the step-time error every row is checked against


def _gpt(layers: int, hidden: int, heads: int, microbatch: int) -> ModelSpec:
    return ModelSpec(name=f"gpt-h{hidden}-l{layers}", layers=layers, hidden=hidden, heads=heads, seq=2048,
                     vocab=51200, microbatch=microbatch, flash_attention=False, tied_embeddings=True)


@dataclass(frozen=True)
class Row:
    name: str
    source: str
    config: str
    unit: str
    measured: float
    predicted: float
    step_error: float  # predicted step time / measured step time - 1 (negative: predicted faster)
    fitted: bool = False
    estimate: Estimate | None = None


KORTHIKANTI_LAYER = _gpt(48, 6144, 64, 4)


def korthikanti_layer(hw: HardwareSpec, sequence_parallel: bool = True,
                      selective: bool = False) -> tuple[float, float]:
    """Forward and forward + backward (full B) of one 22B layer with TP8, in ms."""
    t = layer_times(KORTHIKANTI_LAYER, hw, 8, sequence_parallel=sequence_parallel, selective_recompute=selective)
    return t.f * 1e3, (t.f + t.b) * 1e3


def korthikanti_mfu(hw: HardwareSpec, model: ModelSpec, pp: int, gpus: int, batch: int,
                    p2p: str = "megatron") -> Estimate:
    """A Table 3 setup (TP8, 1F1B, selective recompute, sequence parallel) through ``estimate``."""
    return estimate(EstimateRequest(model=model, hardware=hw, tp=8, pp=pp, dp=gpus // (8 * pp), global_batch=batch,
                                    recompute="selective", p2p=p2p))


# name, layers, hidden, heads, tp, pp, gpus, global batch, microbatch, layers per virtual stage (0: none),
# measured TFLOP/s per GPU; microbatch and virtual stages from examples/sc21/run_table_1.sh
NARAYANAN = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 0, 137.0),
    ("3.6B", 30, 3072, 32, 2, 1, 64, 512, 16, 0, 138.0),
    ("7.5B", 36, 4096, 32, 4, 1, 128, 512, 16, 0, 142.0),
    ("18.4B", 40, 6144, 48, 8, 1, 256, 1024, 8, 0, 135.0),
    ("39.1B", 48, 8192, 64, 8, 2, 512, 1536, 4, 0, 138.0),
    ("76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 2, 5, 140.0),
    ("145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 2, 5, 148.0),
    ("310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 1, 3, 155.0),
    ("529.6B", 105, 20480, 128, 8, 35, 2520, 2520, 1, 1, 163.0),
    ("1008B", 128, 25600, 160, 8, 64, 3072, 3072, 1, 0, 163.0),
]


def narayanan(hw: HardwareSpec, row: tuple, p2p: str = "megatron", interleave: bool = True) -> tuple[float, Estimate]:
    """TFLOP/s per GPU as the paper counts it (recomputation included) and the estimate behind it."""
    _, layers, hidden, heads, tp, pp, gpus, batch, mb, per_virtual, _ = row
    v = layers // (pp * per_virtual) if per_virtual and interleave else 1
    model = _gpt(layers, hidden, heads, mb)
    est = estimate(EstimateRequest(
        model=model, hardware=hw, tp=tp, pp=pp, dp=gpus // (tp * pp), global_batch=batch,
        schedule="interleaved-1f1b" if v > 1 else "1f1b", stages_per_rank=v, recompute="full",
        sequence_parallel=False, p2p=p2p, grad_accumulation="separate"))
    s, h, n, vocab = model.seq, hidden, layers, model.vocab
    flops = 96 * batch * s * n * h * h * (1 + s / (6 * h) + vocab / (16 * n * h))
    return flops / (est.step_seconds * gpus) / 1e12, est


def rows(hw: HardwareSpec, p2p: str = "megatron") -> list[Row]:
    fwd, fwd_bwd = korthikanti_layer(hw)
    src4 = "Korthikanti et al. 2022, Table 4"
    out = [Row("22B layer forward", src4, "h=6144 a=64 s=2048 b=4, TP8 + SP, 8 x A100", "ms", 7.2, fwd,
               fwd / 7.2 - 1, True),
           Row("22B layer fwd+bwd", src4, "same", "ms", 19.0, fwd_bwd, fwd_bwd / 19.0 - 1, True)]
    for name, measured, (f, fb), pick in (
            ("22B layer fwd, no SP", 7.7, korthikanti_layer(hw, sequence_parallel=False), 0),
            ("22B fwd+bwd, no SP", 19.6, korthikanti_layer(hw, sequence_parallel=False), 1),
            ("22B fwd+bwd, sel.", 20.3, korthikanti_layer(hw, selective=True), 1)):
        pred = (f, fb)[pick]
        out.append(Row(name, src4, "same, " + ("SP + selective recomputation" if "sel" in name else
                                              "TP8 without sequence parallelism"), "ms", measured, pred,
                       pred / measured - 1))
    src5 = "Korthikanti et al. 2022, Table 5 (setup: Table 3)"
    for name, model, pp, gpus, batch, measured, config in (
            ("22B MFU", _gpt(48, 6144, 64, 4), 1, 8, 4, 41.5,
             "48 layers, TP8 PP1, 8 GPUs, batch 4, mb 4, selective recompute + SP"),
            ("175B MFU", _gpt(96, 12288, 96, 1), 8, 64, 64, 51.4,
             "96 layers h=12288 a=96, TP8 PP8 (1F1B assumed), 64 GPUs, batch 64, mb 1, selective + SP")):
        est = korthikanti_mfu(hw, model, pp, gpus, batch, p2p)
        out.append(Row(name, src5, config, "% MFU", measured, est.mfu * 100, measured / (est.mfu * 100) - 1,
                       estimate=est))
    for row in NARAYANAN:
        name, layers, hidden, heads, tp, pp, gpus, batch, mb, per_virtual, measured = row
        tflops, est = narayanan(hw, row, p2p)
        v = est.request.stages_for()
        sched = f"interleaved v{v}" if v > 1 else "1F1B" if pp > 1 else "no PP"
        out.append(Row(f"{name} TFLOP/s", "Narayanan et al. 2021, Table 1",
                       f"h={hidden} a={heads} l={layers}, TP{tp} PP{pp} DP{gpus // (tp * pp)} ({sched}), "
                       f"batch {batch}, mb {mb}, full recompute, no SP", "TFLOP/s/GPU", measured, tflops,
                       measured / tflops - 1, estimate=est))
    return out


def fit(hw: HardwareSpec) -> tuple[float, float]:
    """Least squares of the relative errors of the two fitted rows over a grid of the two constants."""
    best: tuple[float, float, float] | None = None
    for frac, half in itertools.product([x / 200 for x in range(120, 200)], range(20, 400, 5)):
        f, fb = korthikanti_layer(replace(hw, gemm_max_fraction=frac, gemm_half_intensity=float(half)))
        err = (f / 7.2 - 1) ** 2 + (fb / 19.0 - 1) ** 2
        if best is None or err < best[0]:
            best = (err, frac, float(half))
    assert best is not None
    return best[1], best[2]


def _breakdown(est: Estimate | None) -> str:
    if est is None:
        return ""
    parts = {"bubble": "bub", "tp_comm": "tp", "pp_comm": "pp", "dp_sync": "dp"}
    return " ".join(f"{short} {est.breakdown[k] / est.step_seconds:.1%}" for k, short in parts.items())


@dataclass(frozen=True, kw_only=True)
class SlowP2P(HardwareSpec):
    """The same GPU with every pipeline point-to-point transfer ``p2p_factor`` times as long (sensitivity)."""

    p2p_factor: float = 1.0

    def p2p_time(self, nbytes: float, within_node: bool) -> float:
        return super().p2p_time(nbytes, within_node) * self.p2p_factor


@dataclass(frozen=True, kw_only=True)
class FixedP2P(HardwareSpec):
    """The same GPU with ``p2p_extra`` seconds added to every pipeline point-to-point transfer (sensitivity)."""

    p2p_extra: float = 0.0

    def p2p_time(self, nbytes: float, within_node: bool) -> float:
        return super().p2p_time(nbytes, within_node) + self.p2p_extra


def _fields(hw: HardwareSpec) -> dict:
    return {f.name: getattr(hw, f.name) for f in fields(hw)}


def previous_errors(text: str) -> dict[str, str]:
    """Each row's step error in an earlier results file (the table's rows only)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        found = re.match(r"(.{20}) .{12} +[\d.]+ +[\d.]+ +([+-][\d.]+%)  (fitted|check)", line)
        if found:
            out[found.group(1).strip()] = found.group(2)
    return out


def report(hw: HardwareSpec, before: dict[str, str] | None = None) -> str:
    lines = [f"# planner_accuracy: estimate vs published (a100 preset: gemm_max_fraction={hw.gemm_max_fraction}, "
             f"gemm_half_intensity={hw.gemm_half_intensity}, NVLink busbw {hw.nvlink_bandwidth / 1e9:.0f} GB/s, "
             f"network {hw.network}; p2p as Megatron runs it)",
             "step err = predicted step time / measured - 1 (per-layer rows: predicted / measured time - 1)"
             + ("; before = the row's step error in the earlier results file given with --before" if before else ""),
             f"{'row':<20} {'unit':<12} {'measured':>9} {'predicted':>9} {'step err':>8}  {'role':<7} "
             + (f"{'before':>7}  " if before else "")
             + "source; configuration [bubble, TP, PP comm, DP sync as % of the predicted step]"]
    worst = 0.0
    table = rows(hw)
    for r in table:
        if not r.fitted:
            worst = max(worst, abs(r.step_error))
        lines.append(f"{r.name:<20} {r.unit:<12} {r.measured:>9.1f} {r.predicted:>9.2f} {r.step_error:>+8.1%}  "
                     f"{'fitted' if r.fitted else 'check':<7} "
                     + (f"{before.get(r.name, '-'):>7}  " if before else "") + f"{r.source}; {r.config}"
                     + (f" [{_breakdown(r.estimate)}]" if r.estimate else ""))
    outside = [r.name for r in table if not r.fitted and abs(r.step_error) > TOLERANCE]
    lines.append(f"worst check-row step-time error: {worst:.1%}; outside +-{TOLERANCE:.0%}: "
                 + (", ".join(outside) if outside else "none"))
    lines += ["", "interleaving: the Narayanan rows the authors ran interleaved, predicted as run, as 1F1B, with "
              "eager (overlapped) point-to-point transfers (pipeoffload's own runtime) instead of Megatron's, and as run "
              "with every point-to-point transfer 2x and 4x as slow (a sensitivity, not a model: TFLOP/s per GPU)",
              f"{'row':<8} {'measured':>8} {'as run':>8} {'1F1B':>8} {'eager p2p':>9} {'p2p x2':>8} {'p2p x4':>8}"]
    for row in NARAYANAN:
        if not row[9] or row[2] // max(1, row[5] * row[9]) <= 1 and row[1] // (row[5] * row[9]) <= 1:
            continue
        as_run = narayanan(hw, row)[0]
        one = narayanan(hw, row, interleave=False)[0]
        eager = narayanan(hw, row, p2p="eager")[0]
        slow = [narayanan(SlowP2P(**_fields(hw), p2p_factor=f), row)[0] for f in (2.0, 4.0)]
        lines.append(f"{row[0]:<8} {row[10]:>8.0f} {as_run:>8.1f} {one:>8.1f} {eager:>9.1f} {slow[0]:>8.1f} {slow[1]:>8.1f}")
    extras = (1e-3, 2e-3, 3e-3)
    lines += ["", "a fixed cost per point-to-point transfer (a sensitivity, not the model: no cost of this size per "
              "exchange is in the 2021 code, see docs/planner.md): step error of the pipelined Narayanan rows with "
              "every transfer " + ", ".join(f"{x * 1e3:.0f} ms" for x in extras) + " longer",
              f"{'row':<8} {'as run':>8} " + " ".join(f"{f'+{x * 1e3:.0f} ms':>8}" for x in extras)]
    for row in NARAYANAN:
        if row[5] == 1:
            continue
        cells = [row[10] / narayanan(hw, row)[0] - 1] + [
            row[10] / narayanan(FixedP2P(**_fields(hw), p2p_extra=x), row)[0] - 1 for x in extras]
        lines.append(f"{row[0]:<8} " + " ".join(f"{c:>+8.1%}" for c in cells))
    lines += ["", "data-parallel gradient reduce (a sensitivity, not the model): the Narayanan rows above reduce fp32 "
              "gradients after the backward, not overlapped (errs slow); the scripts (examples/sc21: --fp16, no "
              "--accumulate-allreduce-grads-in-fp32) reduce fp16 gradients, and the PP1 rows (--DDP-impl torch) overlap "
              "the reduce with the last microbatch's backward. TFLOP/s per GPU (step error): as modelled; with 2-byte "
              "gradients; and, for the PP1 rows, with the whole reduce hidden (the bound of overlapping it)",
              f"{'row':<8} {'measured':>8} {'modelled':>16} {'fp16 reduce':>16} {'+ DDP overlap':>16}"]
    for row in NARAYANAN:
        tflops, est = narayanan(hw, row)
        reduce = _dp_reduce_time(est)
        cells = [tflops, tflops * est.step_seconds / (est.step_seconds - reduce / 2)]
        if row[5] == 1:
            cells.append(tflops * est.step_seconds / (est.step_seconds - reduce))
        text = [f"{x:>7.1f} ({row[10] / x - 1:+5.1%})" for x in cells]
        lines.append(f"{row[0]:<8} {row[10]:>8.0f} " + " ".join(f"{t:>16}" for t in text))
    lines += ["", *_shortfall(hw)]
    lines += ["", *_table_2(hw), "", *_paper_ab(hw)]
    flat = replace(hw, compute_model="flat")
    lines += ["", "the uncalibrated model (compute_model=flat: every FLOP at B_c = 220 TFLOP/s, no element-wise time):"]
    for r in rows(flat):
        lines.append(f"  {r.name:<20} measured {r.measured:>6.1f} predicted {r.predicted:>7.2f} "
                     f"(step err {r.step_error:+.1%})")
    return "\n".join(lines)


def _shortfall(hw: HardwareSpec) -> list[str]:
    """What the pipelined Narayanan rows miss (measured step - predicted step), in the unit of each kind of
    cause: a cost per microbatch, per blocking exchange (a compute step on rank 0, each followed by one),
    per billion weights on the busiest rank, per step (the modelled data-parallel reduce for scale)."""
    lines = ["the pipelined Narayanan rows' shortfall (measured step - predicted step, as modelled) in the unit of "
             "each kind of cost that could explain it: per microbatch, per blocking exchange (rank 0's compute "
             "steps, each followed by one), per billion weights on the busiest rank, and over the modelled "
             "data-parallel reduce (a cost per step)",
             f"{'row':<8} {'schedule':<9} {'meas. s':>8} {'pred. s':>8} {'short s':>8} {'ms/mb':>7} "
             f"{'ms/exch':>8} {'s/Gweight':>9} {'/reduce':>8}"]
    for row in NARAYANAN:
        if row[5] == 1:
            continue
        tflops, est = narayanan(hw, row)
        v, pp, m = est.request.stages_for(), row[5], est.microbatches
        schedule = megatron_order(generate("interleaved-1f1b" if v > 1 else "1f1b", pp, m, v), v > 1)
        exchanges = len(megatron_steps(schedule.actions[0], v > 1))
        measured = est.step_seconds * tflops / row[10]
        short = measured - est.step_seconds
        s = _plan_request(est.request).setup
        weights = max(a - b for a, b in zip(est.memory_per_rank, est.activation_per_rank)) / (
            s.weight_bytes + s.grad_bytes + s.optimizer_bytes)
        lines.append(f"{row[0]:<8} {f'v{v}' if v > 1 else '1F1B':<9} {measured:>8.2f} {est.step_seconds:>8.2f} "
                     f"{short:>+8.2f} {short / m * 1e3:>+7.1f} {short / exchanges * 1e3:>+8.2f} "
                     f"{short / weights * 1e9:>+9.2f} {short / _dp_reduce_time(est):>+8.2f}")
    return lines


# the paper's own A/B runs (examples/sc21/run_figure_12.sh, run_figure_18.sh): GPT 175B, TP8 PP12 on 96 GPUs,
# microbatch 1, 2 layers per virtual stage when interleaved (v4), global batch 12-60; the figures give no table
FIGURE_12 = [("175B", 96, 12288, 96, 8, 12, 96, batch, 1, 2, 0.0) for batch in (12, 24, 36, 48, 60)]


# Table 2's PTD-P rows (same paper): the same name/layout fields as NARAYANAN; the schedule is not stated, so
# "layers per virtual stage" is what the interleaved reading uses (Figures 12/18's 2 for 175B, Table 1's 1 for 530B)
TABLE_2 = [("174.6B", 96, 12288, 96, 8, 12, gpus, 1536, 1, 2, tflops) for gpus, tflops in
           ((384, 153.0), (768, 149.0), (1536, 141.0))] + \
          [("529.6B", 105, 20480, 128, 8, 35, gpus, 2240, 1, 1, tflops) for gpus, tflops in
           ((560, 171.0), (1120, 167.0), (2240, 159.0))]


def _overhead(first: tuple[int, float], last: tuple[int, float]) -> float:
    """Per-step time outside the microbatches' own work (bubble, reduce, optimizer), X microbatch-times, from
    the throughputs T_1, T_2 of the same per-microbatch work at m_1, m_2 microbatches: a step of m takes m + X
    microbatch-times, so T_1 (1 + X/m_1) = T_2 (1 + X/m_2)."""
    (m1, t1), (m2, t2) = first, last
    return (t1 - t2) / (t2 / m2 - t1 / m1)


def _table_2(hw: HardwareSpec) -> list[str]:
    """The PTD-P rows of the paper's Table 2 (ZeRO-3 comparison: fixed batch, more GPUs, fewer microbatches per
    pipeline), predicted as 1F1B and as interleaved, since the paper does not say which ran."""
    lines = ["held-back rows (not in the table above): Narayanan et al. 2021 Table 2's PTD-P rows (fixed batch, "
             "TP8, mb 1, full recompute; the schedule is not stated), TFLOP/s per GPU (step error) as 1F1B and as "
             "interleaved (175B: 2 layers per virtual stage, v4, as Figure 12; 530B: 1, v3, as Table 1); last line of "
             "each model: the per-step overhead (bubble, reduce, optimizer) in microbatch-times that the first and "
             "last row imply, X in T_1 (1 + X/m_1) = T_3 (1 + X/m_3)",
             f"{'row':<8} {'layout':<12} {'GPUs':>5} {'m':>5} {'measured':>8} {'as 1F1B':>16} {'interleaved':>16}"]
    for name in ("174.6B", "529.6B"):
        rows_ = [r for r in TABLE_2 if r[0] == name]
        points: dict[str, list[tuple[int, float]]] = {"measured": [], "1f1b": [], "il": []}
        for row in rows_:
            m = row[7] // (row[6] // (row[4] * row[5]))
            one, il = narayanan(hw, row, interleave=False)[0], narayanan(hw, row)[0]
            for key, value in (("measured", row[10]), ("1f1b", one), ("il", il)):
                points[key].append((m, value))
            cells = [f"{x:>7.1f} ({row[10] / x - 1:+5.1%})" for x in (one, il)]
            lines.append(f"{name:<8} {f'TP{row[4]} PP{row[5]}':<12} {row[6]:>5} {m:>5} {row[10]:>8.0f} "
                         + " ".join(f"{c:>16}" for c in cells))
        x = {k: _overhead(v[0], v[-1]) for k, v in points.items()}
        lines.append(f"{name:<8} {'overhead X':<12} {'':>5} {'':>5} {x['measured']:>8.1f} {x['1f1b']:>16.1f} "
                     f"{x['il']:>16.1f}")
    return lines


def _paper_ab(hw: HardwareSpec) -> list[str]:
    """The model on the settings of the paper's Figures 12 (interleaved against 1F1B) and 18 (scatter/gather on
    and off, interleaved), to set beside what the paper says of them. Without scatter/gather each TP rank sends
    the whole boundary tensor (transfers ``tp`` times as long); the all-gather after the receive stays charged,
    so the model's gain from scatter/gather is at most what is shown, and interleaved against 1F1B without it
    at least. Then the same with every transfer 1.5x and 2x as long (a sensitivity, not the model)."""
    lines = ["the paper's A/B settings (Figures 12 and 18: GPT 175B, TP8 PP12, 96 GPUs, mb 1, interleaved v4), "
             "TFLOP/s per GPU as 1F1B and interleaved, then for every transfer 1x, 1.5x and 2x as long as modelled: "
             "the gain of scatter/gather (interleaved; an upper bound: the all-gather stays charged without it) and "
             "interleaved over 1F1B, both without scatter/gather (a lower bound)",
             f"{'batch':<6} {'1F1B':>6} {'interl.':>7} {'gain':>7}  "
             + "  ".join(f"{f'x{f:g}: S/G':>10} {'il/1F1B':>8}" for f in (1.0, 1.5, 2.0))]
    for row in FIGURE_12:
        one, il = narayanan(hw, row, interleave=False)[0], narayanan(hw, row)[0]
        cells = []
        for f in (1.0, 1.5, 2.0):
            on, off = (SlowP2P(**_fields(hw), p2p_factor=f * k) for k in (1, row[4]))
            il_off = narayanan(off, row)[0]
            gain, lead = narayanan(on, row)[0] / il_off - 1, il_off / narayanan(off, row, interleave=False)[0] - 1
            cells.append(f"{gain:>+10.1%} {lead:>+8.1%}")
        lines.append(f"{row[7]:<6} {one:>6.1f} {il:>7.1f} {il / one - 1:>+7.1%}  " + "  ".join(cells))
    return lines


def _dp_reduce_time(est: Estimate) -> float:
    """The data-parallel gradient reduce in ``est``'s dp_sync (without the optimizer step and the tied
    embedding's all-reduce)."""
    req = est.request
    plan_req = _plan_request(req)
    s = plan_req.setup
    # the busiest rank's weights (what dp_sync is charged for), from its static memory
    local = max(m - a for m, a in zip(est.memory_per_rank, est.activation_per_rank)) / (
        s.weight_bytes + s.grad_bytes + s.optimizer_bytes / (req.dp if s.distributed_optimizer else 1))
    return est.breakdown["dp_sync"] - optimizer_step_time(plan_req, req.layout, local) - embedding_sync_time(
        plan_req, req.layout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="also write the report to this file")
    parser.add_argument("--fit", action="store_true", help="fit the GEMM curve on the fitted rows and print it")
    parser.add_argument("--before", help="an earlier results file: show each row's step error there beside ours")
    args = parser.parse_args()
    hw = hardware_preset("a100")
    if args.fit:
        frac, half = fit(hw)
        print(f"fitted: gemm_max_fraction={frac} gemm_half_intensity={half}")
        hw = replace(hw, gemm_max_fraction=frac, gemm_half_intensity=half)
    before = None
    if args.before:
        with open(args.before, encoding="utf-8") as f:
            before = previous_errors(f.read())
    text = report(hw, before)
    print(text)
    if args.save:
        command = f"# command: .venv/bin/python {shlex.join(sys.argv)}"  # the file names what wrote it
        write_atomic(args.save, f"{command}\n{text}\n")


if __name__ == "__main__":
    main()
