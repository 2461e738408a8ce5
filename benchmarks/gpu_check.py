"""`make gpu-check`: the checks to run on a machine with a CUDA GPU, in one go, under 8 minutes.

1. ``pytest tests/gpu`` (the CUDA paths of the runtime: copy streams, events, pinned buffers);
2. ``benchmarks/gpu_offload_replay.py`` (one rank of a 4-rank schedule replayed with real layers);
3. a 1-GPU training run of the reference GPT through the runtime itself (``PipelineRunner`` on one
   rank, interleaved-1f1b with 2 stages) with offload ``none`` vs ``all``: step time,
   ``torch.cuda.max_memory_allocated``, and the copy GB/s the store achieved next to the peak of a
   pinned-memory ``cudaMemcpy`` measured here on the same GPU;
4. the same for the Llama-family model (GQA, SwiGLU, RoPE) in bf16 autocast with fp32 weights, as
   ``train --model llama --dtype bf16`` runs it.

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


def train_once(size: TrainSize, offload: str, device_name: str) -> dict[str, Any]:
    """Train the reference GPT for ``size.steps`` measured steps on one device through the runtime."""
    import torch

    from pipeoffload import generate, lower
    from pipeoffload.models import GPTConfig, build_rank_stages, even_counts, gpt_layers, lm_loss, sample_batch
    from pipeoffload.runtime import PipelineRunner

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    schedule = lower(generate("interleaved-1f1b", 1, size.microbatches, 2), offload=offload)
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
        "model": size.model, "offload": offload, "step_s": statistics.median(times), "losses": losses,
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


def compare_offload(table: Table, size: TrainSize, device: str, peak: dict[str, float] | None) -> list[dict]:
    rows = [train_once(size, offload, device) for offload in ("none", "all")]
    for r in rows:
        mem = f"max_allocated {r['max_allocated'] / 2**30:.2f} GiB" if r["max_allocated"] is not None else \
            "max_allocated n/a (cpu)"
        copies = ""
        if r["offload"] != "none":
            copies = f", copies D2H {r['d2h_gbps']:.1f} / H2D {r['h2d_gbps']:.1f} GB/s"
            if peak:
                copies += f" (pinned memcpy peak {peak['d2h']:.1f} / {peak['h2d']:.1f} GB/s)"
        table.add(f"train {r['model']} {size.dtype} {device} offload={r['offload']}", f"{r['step_s']:.3f} s/step",
                  f"{mem}, store peak {r['store_peak'] / 2**30:.2f} GiB{copies}")
    none, full = rows
    if full["step_s"] > 0 and none["step_s"] > 0:
        saved = ""
        if none["max_allocated"] and full["max_allocated"]:
            saved = f", max_allocated all/none {full['max_allocated'] / none['max_allocated']:.2f}"
        table.add(f"train {size.model} offload all vs none", f"{full['step_s'] / none['step_s']:.2f}x step time",
                  saved.lstrip(", "))
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu (tiny training run only)")
    p.add_argument("--out", default=None, help=f"write the table here (default on CUDA: {RESULT.relative_to(ROOT)})")
    p.add_argument("--skip-tests", action="store_true", help="skip pytest tests/gpu and the replay benchmark")
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
        check_gpu_tests(table, timeout=150)
        notes = check_replay(table, timeout=150)
    peak = pinned_memcpy_gbps() if cuda else None
    if peak:
        table.add("pinned memcpy peak", f"D2H {peak['d2h']:.1f} GB/s", f"H2D {peak['h2d']:.1f} GB/s (256 MiB, best of 5)")
    for size in (TrainSize(), LLAMA) if cuda else (TINY, TINY_LLAMA):
        compare_offload(table, size, device, peak)
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
