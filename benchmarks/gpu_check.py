"""`make gpu-check`: the checks to run on a machine with a CUDA GPU, in one go, under 8 minutes.

1. ``pytest tests/gpu`` (the CUDA paths of the runtime: copy streams, events, pinned buffers);
2. ``benchmarks/gpu_offload_replay.py`` (one rank of a 4-rank schedule replayed with real layers);
3. a 1-GPU training run of the reference GPT through the runtime itself (``PipelineRunner`` on one
   rank, interleaved-1f1b with 2 stages) with offload ``none`` vs ``all``: step time,
   ``torch.cuda.max_memory_allocated``, and the copy GB/s the store achieved next to the peak of a
   pinned-memory ``cudaMemcpy`` measured here on the same GPU;
4. the same for the Llama-family model (GQA, SwiGLU, RoPE) in bf16 autocast with fp32 weights, as
   ``train --model llama --dtype bf16`` runs it, and for zb-v (split backward: the I -> W window);
   each comparison says whether the losses of offload ``none`` and ``all`` are bitwise equal;
5. ``pipeoffload train`` itself on the GPU (Llama, bf16, interleaved 1F1B over 2 stages): offload
   ``none`` and ``all`` (cuda max allocated, measured vs simulated activation peak), and a run stopped
   at step 3 and resumed, whose losses must equal the straight run's bitwise.

A part that fails is one FAILED row with its error; the others still run.

Prints one table and writes it to ``benchmarks/results/gpu_check.txt``. Without CUDA it says so and
exits 0 (``--device cpu`` runs part 3 tiny, as the test suite does, and writes nowhere unless ``--out``).
"""
from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULT = ROOT / "benchmarks" / "results" / "gpu_check.txt"


@dataclass
class TrainSize:
    """The 1-GPU training run's model and batch."""

    hidden: int = 2048
    heads: int = 16
    layers: int = 8
    seq: int = 2048
    vocab: int = 32000
    batch: int = 16  # sequences per step, 2 per microbatch
    microbatches: int = 8
    steps: int = 4
    warmup: int = 2
    dtype: str = "bfloat16"
    model: str = "gpt"  # or "llama": fp32 weights under bf16 autocast when dtype is bfloat16


TINY = TrainSize(hidden=32, heads=2, layers=2, seq=16, vocab=64, batch=8, microbatches=4, steps=2, warmup=1,
                 dtype="float32")
LLAMA = TrainSize(hidden=2048, heads=16, layers=8, seq=4096, vocab=32000, batch=16, microbatches=8, steps=4,
                  warmup=2, dtype="bfloat16", model="llama")
DETERMINISTIC = TrainSize(hidden=1024, heads=16, layers=4, seq=1024, vocab=32000, batch=16, microbatches=8,
                          steps=3, warmup=1, dtype="bfloat16", model="llama")
TINY_LLAMA = TrainSize(hidden=32, heads=4, layers=2, seq=16, vocab=64, batch=8, microbatches=4, steps=2, warmup=1,
                       dtype="bfloat16", model="llama")


@dataclass
class Table:
    """Rows of (check, result, detail) rendered as one fixed-width table."""

    title: str
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, check: str, result: str, detail: str = "") -> None:
        self.rows.append((check, result, detail))

    def render(self) -> str:
        widths = [max(len(h), *(len(r[i]) for r in self.rows)) if self.rows else len(h)
                  for i, h in enumerate(("check", "result", "detail"))]
        line = "  ".join("-" * w for w in widths)
        head = "  ".join(h.ljust(w) for h, w in zip(("check", "result", "detail"), widths)).rstrip()
        body = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in self.rows]
        return "\n".join([self.title, head, line, *body]) + "\n"


def pytest_summary(output: str) -> str:
    """'3 passed, 1 skipped' from pytest's last summary line (or 'no summary')."""
    found = re.findall(r"(\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed|deselected))", output)
    return ", ".join(found[-4:]) if found else "no summary"


def _run(cmd: list[str], timeout: float) -> tuple[int | None, str]:
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, out
    return done.returncode, done.stdout + done.stderr


def check_gpu_tests(table: Table, timeout: float) -> None:
    code, out = _run([sys.executable, "-m", "pytest", "-q", "tests/gpu"], timeout)
    status = "timed out" if code is None else ("ok" if code == 0 else f"FAILED (exit {code})")
    table.add("pytest tests/gpu", status, pytest_summary(out))


def check_replay(table: Table, timeout: float) -> list[str]:
    code, out = _run([sys.executable, "benchmarks/gpu_offload_replay.py", "--device", "cuda"], timeout)
    status = "timed out" if code is None else ("ok" if code == 0 else f"FAILED (exit {code})")
    ratio = re.search(r"step time ratio all/none: ([\d.]+)", out)
    table.add("gpu_offload_replay.py", status, f"step time all/none {ratio.group(1)}" if ratio else "")
    return out.strip().splitlines()[-6:] if code == 0 else out.strip().splitlines()[-10:]


# ---- part 3: training through the runtime on one device -------------------------------------------
def pinned_memcpy_gbps(nbytes: int = 256 * 2**20, repeats: int = 5) -> dict[str, float]:
    """Best D2H and H2D GB/s of one pinned-host <-> device copy of ``nbytes`` (CUDA events)."""
    import torch

    device_buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    out = {}
    for name, dst, src in (("d2h", host, device_buf), ("h2d", device_buf, host)):
        best = float("inf")
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        out[name] = nbytes / best / 1e9
    return out


def train_once(size: TrainSize, offload: str, device_name: str, family: str = "interleaved-1f1b") -> dict[str, Any]:
    """Train the reference GPT for ``size.steps`` measured steps on one device through the runtime."""
    import torch

    from pipeoffload import generate, lower
    from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
    from pipeoffload.runtime import PipelineRunner

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    schedule = lower(generate(family, 1, size.microbatches, 2), offload=offload)
    autocast: Any = contextlib.nullcontext()
    if size.model == "llama":
        layers, inputs, targets = _llama(size, device)
        autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    else:
        cfg = GPTConfig(vocab=size.vocab, seq=size.seq, hidden=size.hidden, heads=size.heads, layers=size.layers,
                        flash=cuda)
        layers = [layer.to(device=device, dtype=getattr(torch, size.dtype)) for layer in gpt_layers(cfg, seed=0)]
        # flash attention takes no padding mask: unpadded batches on CUDA
        inputs, targets = sample_batch(cfg, size.batch, seed=0, padded=not cuda)
    stages = build_rank_stages(layers, even_counts(len(layers), schedule.num_stages), schedule.placement, 0)
    runner = PipelineRunner(stages, schedule, 0, loss_fn=lm_loss, device=device)
    opt = torch.optim.SGD([p for m in stages.values() for p in m.parameters()], lr=1e-3)
    times, losses = [], []
    for step in range(size.warmup + size.steps):
        if step == size.warmup:
            runner.store.copier.stats = type(runner.store.copier.stats)()
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        with autocast:
            loss = runner.step(inputs, targets)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        if step >= size.warmup:
            times.append(time.perf_counter() - start)
        if loss is not None:
            losses.append(float(loss))
    stats = runner.store.copier.stats
    return {
        "model": size.model, "family": family, "offload": offload, "step_s": statistics.median(times), "losses": losses,
        "max_allocated": torch.cuda.max_memory_allocated(device) if cuda else None,
        "store_peak": runner.trace.peak_bytes if runner.trace else 0,
        "d2h_gbps": stats.gbps("d2h"), "h2d_gbps": stats.gbps("h2d"),
    }


def _llama(size: TrainSize, device: Any) -> tuple[list[Any], tuple[Any, None, int], Any]:
    """A Llama-family model (GQA: a quarter of the heads for keys and values) with fp32 weights, and
    one batch of random tokens (no padding: the causal SDPA path)."""
    import torch

    from pipeoffload.llama_config import LlamaShape
    from pipeoffload.models.llama import llama_layers

    shape = LlamaShape(vocab=size.vocab, hidden=size.hidden, layers=size.layers, heads=size.heads,
                       kv_heads=max(1, size.heads // 4), max_positions=size.seq)
    layers = llama_layers(shape, seed=0, tie=False, device=device)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq), generator=gen).to(device)
    targets = torch.randint(0, size.vocab, (size.batch, size.seq), generator=gen).to(device)
    return layers, (tokens, None, 0), targets


def compare_offload(table: Table, size: TrainSize, device: str, peak: dict[str, float] | None,
                    family: str = "interleaved-1f1b") -> list[dict]:
    rows = [train_once(size, offload, device, family) for offload in ("none", "all")]
    for r in rows:
        mem = f"max_allocated {r['max_allocated'] / 2**30:.2f} GiB" if r["max_allocated"] is not None else \
            "max_allocated n/a (cpu)"
        copies = ""
        if r["offload"] != "none":
            copies = f", copies D2H {r['d2h_gbps']:.1f} / H2D {r['h2d_gbps']:.1f} GB/s"
            if peak:
                copies += f" (pinned memcpy peak {peak['d2h']:.1f} / {peak['h2d']:.1f} GB/s)"
        table.add(f"train {r['model']} {family} {size.dtype} {device} offload={r['offload']}",
                  f"{r['step_s']:.3f} s/step",
                  f"{mem}, store peak {r['store_peak'] / 2**30:.2f} GiB{copies}")
    none, full = rows
    if full["step_s"] > 0 and none["step_s"] > 0:
        saved = ""
        if none["max_allocated"] and full["max_allocated"]:
            saved = f", max_allocated all/none {full['max_allocated'] / none['max_allocated']:.2f}"
        same = "losses bitwise equal" if none["losses"] == full["losses"] else \
            "losses differ (fused CUDA kernels vary run to run: see the deterministic row)"
        table.add(f"train {size.model} {family} offload all vs none",
                  f"{full['step_s'] / none['step_s']:.2f}x step time", f"{saved.lstrip(', ')}, {same}".lstrip(", "))
    return rows


def check_deterministic_equality(table: Table, device: str) -> None:
    """Offload none vs all with deterministic kernels (``train --deterministic``'s): bitwise equal losses,
    where the fused attention kernels of part 4 differ from run to run by themselves."""
    from pipeoffload.train.launch import deterministic_kernels

    size = DETERMINISTIC if device.startswith("cuda") else TINY_LLAMA
    with deterministic_kernels(True):
        none, none_again, full = (train_once(size, offload, device)["losses"] for offload in ("none", "none", "all"))
    table.add(f"train {size.model} deterministic kernels: offload all vs none",
              "losses bitwise equal" if none == full else "LOSSES DIFFER",
              f"none run twice: {'equal' if none == none_again else 'DIFFER'}; losses {full[-1]:.6f} / {none[-1]:.6f}")


# ---- part 5: `pipeoffload train` itself on the GPU -------------------------------------------------
TRAIN_FLAGS = ["--model", "llama", "--layers", "8", "--hidden", "1024", "--heads", "16", "--kv-heads", "4",
               "--seq-len", "1024", "--dtype", "bf16", "--schedule", "interleaved-1f1b", "--stages-per-rank", "2",
               "--global-batch", "16", "--microbatches", "8", "--steps", "6", "--save-every", "3",
               "--no-progress", "--timeout", "300", "--deterministic"]


def _train_cli(out: Path, *extra: str, timeout: float = 240) -> list[dict[str, Any]]:
    """Run ``pipeoffload train`` as a user does and return its metrics rows (raises on failure)."""
    import json

    code, log = _run([sys.executable, "-m", "pipeoffload", "train", *extra, "--out", str(out)], timeout)
    if code != 0:
        tail = " | ".join(log.strip().splitlines()[-3:])
        raise RuntimeError(f"train {' '.join(extra[-4:])} exited {code}: {tail}")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def check_train_cli(table: Table, work: Path) -> None:
    """`pipeoffload train` on one GPU: offload none vs all, and stop at 3 + resume equal to a straight run."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for offload in ("none", "all"):
        rows[offload] = _train_cli(work / f"straight-{offload}", *TRAIN_FLAGS, "--offload", offload)
        last = rows[offload][-1]
        cuda = last.get("cuda_max_allocated")
        cuda_text = f"cuda max allocated {max(cuda) / 2**30:.2f} GiB" if cuda else "cuda max allocated n/a"
        table.add(f"train CLI llama bf16 offload={offload}", f"{last['step_s']:.3f} s/step",
                  f"{cuda_text}, act peak measured {max(last['peak_act_bytes']) / 2**20:.1f} MiB"
                  f" / simulated {max(last['sim_peak_act_bytes']) / 2**20:.1f} MiB, loss {last['loss']:.4f}")
    resumed_dir = work / "resumed-all"
    _train_cli(resumed_dir, *TRAIN_FLAGS, "--offload", "all", "--stop-at", "3")
    resumed = _train_cli(resumed_dir, "--resume", str(resumed_dir), "--no-progress", "--deterministic",
                         timeout=240)
    straight = {r["step"]: r["loss"] for r in rows["all"]}
    after = {r["step"]: r["loss"] for r in resumed if r["step"] > 3}
    equal = bool(after) and all(straight.get(step) == loss for step, loss in after.items())
    table.add("train CLI stop at 3 + resume vs straight", "bitwise equal" if equal else "DIFFER",
              f"steps {sorted(after)}: " + ", ".join(f"{after[s]:.6f}/{straight.get(s, float('nan')):.6f}"
                                                      for s in sorted(after)))


def guarded(table: Table, label: str, part: Any, *args: Any) -> Any:
    """Run one part; a failure becomes one FAILED row (with its traceback printed) and the rest go on."""
    import traceback

    try:
        return part(*args)
    except Exception as exc:  # noqa: BLE001 - one broken part must not hide the others' figures
        traceback.print_exc()
        table.add(label, "FAILED", f"{type(exc).__name__}: {exc}"[:300])
        return None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu (tiny training run only)")
    p.add_argument("--out", default=None, help=f"write the table here (default on CUDA: {RESULT.relative_to(ROOT)})")
    p.add_argument("--skip-tests", action="store_true", help="skip pytest tests/gpu and the replay benchmark")
    p.add_argument("--skip-cli", action="store_true", help="skip the `pipeoffload train` runs (part 5)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else None)
    if device is None or (device.startswith("cuda") and not torch.cuda.is_available()):
        print("gpu-check needs CUDA (torch.cuda.is_available() is False here): nothing run")
        return 0
    begin = time.monotonic()
    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    table = Table(f"gpu-check on {name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}")
    notes: list[str] = []
    if cuda and not args.skip_tests:
        guarded(table, "pytest tests/gpu", check_gpu_tests, table, 150)
        notes = guarded(table, "gpu_offload_replay.py", check_replay, table, 150) or []
    peak = guarded(table, "pinned memcpy peak", pinned_memcpy_gbps) if cuda else None
    if peak:
        table.add("pinned memcpy peak", f"D2H {peak['d2h']:.1f} GB/s", f"H2D {peak['h2d']:.1f} GB/s (256 MiB, best of 5)")
    gpt, llama = (TrainSize(), LLAMA) if cuda else (TINY, TINY_LLAMA)
    for size, family in ((gpt, "interleaved-1f1b"), (llama, "interleaved-1f1b"), (gpt, "zb-v")):
        guarded(table, f"train {size.model} {family}", compare_offload, table, size, device, peak, family)
    guarded(table, "train llama deterministic kernels", check_deterministic_equality, table, device)
    if cuda and not args.skip_cli:
        with tempfile.TemporaryDirectory() as work:
            guarded(table, "train CLI", check_train_cli, table, Path(work))
    table.add("total", f"{time.monotonic() - begin:.0f} s", "")
    text = table.render()
    if notes:
        text += "\ngpu_offload_replay.py (last lines):\n" + "\n".join(notes) + "\n"
    print(text, end="")
    out = args.out or (str(RESULT) if cuda else None)
    if out:
        from pipeoffload.fileio import write_atomic

        write_atomic(out, text)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
