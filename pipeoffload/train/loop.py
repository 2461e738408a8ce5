"""The training loop of one rank: pipeline step, data-parallel average, clip, AdamW, metrics, eval, checkpoints.

``Trainer`` drives a ``PipelineRunner`` (the runtime) over this rank's stages. The gradients of the
data-parallel replicas are averaged per stage as soon as the runner has run the stage's last
backward (one flat all-reduce per dtype, in the background; awaited after the runner's step; with
``--fsdp`` FSDP2 reduce-scatters them there instead, see ``train.fsdp``); with tensor parallelism the
sequence-parallel ``Partial`` gradients are then summed once (``optim.replicate_partial_gradients``),
the global norm is clipped (see ``optim.global_grad_norm``: the same bits in every layout), the
optimizer steps. Every rank's measurements of the step come to every rank with one all-reduce of
their own: the loss and the stop flag each step, the memory and timings only on steps that are
logged (``log_every``; the activation memory is measured only then). Rank 0 hands each logged record
to the run's ``MetricsLogger``s (``metrics.jsonl``, TensorBoard) and draws the progress bar; the
last ``keep_records`` records stay in memory (``history``). SIGINT/SIGTERM set a flag; the step in
flight finishes, all ranks agree at the next gather, save a checkpoint and return.
"""
from __future__ import annotations

import contextlib
import logging
import math
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from pipeoffload.errors import ConfigError
from pipeoffload.ir import Schedule
from pipeoffload.runtime import PipelineRunner
from pipeoffload.train import checkpoint
from pipeoffload.train.config import TrainConfig, setting
from pipeoffload.train.fsdp import ShardedStages
from pipeoffload.train.mesh import RankContext, doing
from pipeoffload.train.metrics import (
    MetricsError,
    MetricsLogger,
    SimulatedPeaks,
    close_loggers,
    make_loggers,
    reload_seconds,
)
from pipeoffload.train.model import RankModel
from pipeoffload.train.optim import (
    OverlappedAverage,
    apply_options,
    average_gradients,
    clip_gradients,
    global_grad_norm,
    lr_at,
    make_optimizer,
    replicate_partial_gradients,
    set_lr,
)

log = logging.getLogger(__name__)
_BRIEF = 3  # measurements of every step: has a loss, the loss, the stop signal
_HEAD = 8  # measurements of a logged step before the per-stage slot bytes in a row of the board
# A parameter this large (in absolute value) was grown by the optimizer, far past what an initialisation or
# a sane learning rate gives: a non-finite validation loss with such weights is the learning rate's doing.
_INFLATED = 1e3
LossFn = Callable[[Any, Any], torch.Tensor]


class DataError(RuntimeError):
    """The run's data source (``batches.train`` or ``batches.val``) failed; the message names the step and the
    rank."""


_END = object()  # ``_val_batches``: the data source has no more batches


def _read(rank: int, what: str, call: str, read: Callable[[], Any]) -> Any:
    """``read()`` of the data source; its own error (a ``sys.exit()`` in it too) names ``what`` was read,
    the rank and the call, rather than only the error's type."""
    try:
        return read()
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:  # the data source's own error: say which batch and whose code
        raise DataError(f"reading {what} failed on rank {rank}: the batches' {call} raised {_brief(exc)}; "
                        "fix the data source") from exc


def _brief(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm was not finite more often than allowed."""


class BatchSource(Protocol):
    """What the loop reads: the step's inputs and targets for one data-parallel replica."""

    tokens_per_sample: int

    def train(self, step: int, dp_rank: int) -> tuple[Any, Any]: ...  # 0-based step

    def val(self, dp_rank: int) -> list[tuple[Any, Any]]: ...


class Trainer:
    def __init__(self, cfg: TrainConfig, ctx: RankContext, schedule: Schedule, model: RankModel, loss_fn: LossFn,
                 batches: BatchSource, run_dir: Path | None) -> None:
        self.cfg, self.ctx, self.schedule, self.model = cfg, ctx, schedule, model
        self.loss_fn, self.batches, self.run_dir = loss_fn, batches, run_dir
        # --fsdp: every stage sharded over the dp group (its parameters become DTensor shards, which the
        # optimizer and the checkpoints see); the loop gathers and reduce-scatters it (see train.fsdp)
        self.fsdp = ShardedStages(model.stages, ctx.mesh["dp"]) if cfg.parallel.fsdp and ctx.dp > 1 else None
        self.named = model.named_parameters()
        # the data-parallel mean of each stage's gradients starts after its last B/W (see OverlappedAverage);
        # a tied embedding's copies are averaged after their sum across pipeline ranks
        self.late_params = [p for n, p in self.named.items() if model.tied and n in model.tied.names]
        self.grad_mean = OverlappedAverage({s: list(m.parameters()) for s, m in model.stages.items()}, ctx.dp_group,
                                           ctx.dp, later=self.late_params) if ctx.dp > 1 and not self.fsdp else None
        reduce = self.fsdp.reduce if self.fsdp else self.grad_mean.launch if self.grad_mean else None
        self.runner = PipelineRunner(model.stages, schedule, ctx.pp_rank, group=ctx.pp_group if ctx.pp > 1 else None,
                                     loss_fn=loss_fn, device=ctx.device, timeout=cfg.run.timeout,
                                     on_stage_gradients=reduce)
        self.params = list(self.named.values())
        # a tied head's copy holds the embedding's gradient: the norm counts the shared weight once
        self.norm_named = {n: p for n, p in self.named.items() if not (model.tied and n == model.tied.names[1])}
        self.order = self._name_order()
        self.opt = make_optimizer(cfg, self.params, ctx.dp_group, ctx.dp)
        self.saver = checkpoint.Saver(cfg)
        self.sim = SimulatedPeaks(self.runner.schedule)
        self.step = 0
        self.stop_signal = 0
        self.skipped = 0  # steps whose optimizer step was skipped for a non-finite loss or norm
        self.history: deque[dict[str, Any]] = deque(maxlen=cfg.metrics.keep_records)  # the last logged records
        self._peer_stop = 0

    def _val_batches(self) -> Iterator[Any]:
        """The held-out batches of ``batches.val`` (a list or any iterable, read lazily as before)."""
        what, call = f"the validation batches after step {self.step}", f"val(dp_rank={self.ctx.dp_rank})"
        rank = self.ctx.rank
        source = _read(rank, what, call, lambda: iter(self.batches.val(self.ctx.dp_rank)))
        while (batch := _read(rank, what, call, lambda: next(source, _END))) is not _END:
            yield batch

    def _name_order(self) -> dict[str, int]:
        """Index of every parameter of the whole model (names from all ranks, sorted)."""
        mine = sorted(self.named)
        everyone: list[Any] = [None] * self.ctx.world
        with self.ctx.collective("setting up (gathering the parameter names of every rank)"):
            dist.all_gather_object(everyone, mine)
        names = sorted({n for part in everyone for n in part})
        return {n: i for i, n in enumerate(names)}

    # ---- one step ----------------------------------------------------------------------------------
    def _autocast(self) -> Any:
        """bf16 autocast with ``dtype=bf16`` (CPU too); the parameters and AdamW's state stay fp32."""
        if self.cfg.model.dtype == "bf16":
            return torch.autocast(self.ctx.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_step(self, measure: bool = True) -> dict[str, Any]:
        """One optimizer step. ``measure``: measure the activation memory and return the full record
        (a logged step); else the record has the step, losses, lr, norm and timings only."""
        cfg, ctx = self.cfg, self.ctx
        step = self.step + 1
        lr = lr_at(cfg, step)
        set_lr(self.opt, lr)
        inputs, targets = _read(ctx.rank, f"the training batch of step {step}", f"train({step - 1}, dp_rank={ctx.dp_rank})",
                                lambda: self.batches.train(step - 1, ctx.dp_rank))
        if measure and ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        t0 = time.perf_counter()
        if self.fsdp is not None:
            with ctx.collective(f"gathering the sharded parameters for step {step}"):
                self.fsdp.begin_step()
            self.runner.refresh_parameters()  # the all-gathered tensors, not the shards, run the step
        with self._autocast():
            loss = self.runner.step(inputs, targets, measure=measure, step=step)  # failures name the run's step
        if self.model.tied is not None:
            with ctx.collective(f"summing the gradients of the tied embedding and head of step {step}"):
                self.model.tied.reduce()
        with ctx.collective(f"averaging the gradients of step {step} over the data-parallel group"):
            if self.grad_mean is not None:
                self.grad_mean.wait()
            if self.fsdp is not None:
                self.fsdp.finish()
            average_gradients(self.late_params, ctx.dp_group, ctx.dp)
        if ctx.tp > 1:  # the sequence-parallel norms' gradients: summed once here, not in every op of AdamW
            with ctx.collective(f"summing the tensor-parallel partial gradients of step {step}"):
                replicate_partial_gradients(self.params)
        board = self._measurements(loss, self.runner.trace if measure else None)
        with ctx.collective(f"reducing the gradient norm of step {step} over every rank"):
            norm = global_grad_norm(self.norm_named, self.order, ctx.dp_rank, ctx.tp_rank, ctx.device,
                                    dp_sharded=self.fsdp is not None)
        with ctx.collective(f"gathering the measurements of step {step} from every rank"):
            # after the norm's, which the slowest rank's end of the pipeline has already held up: this
            # one waits for no rank. Started before it and awaited after (overlapped) it bought no wall
            # time and cost gloo ranks more process CPU (benchmarks/train_throughput.py, zb-v, rank 1's
            # CPU after the pipeline 8.3-9.1 ms against 6.7-7.0)
            everyone = self._rows(self._gather(board))
        losses = [r["loss"] for r in everyone if r["loss"] is not None]
        finite = math.isfinite(norm) and all(math.isfinite(x) for x in losses)  # the same on every rank
        if finite:
            with doing(ctx.rank, f"taking the optimizer step of step {step}"):
                clip_gradients(self.params, norm, cfg.optim.clip)
                self.opt.step()
        else:  # the ranks whose own loss was not finite: a data-parallel replica's batch, a stage's rank
            bad = [r for r, row in enumerate(everyone) if row["loss"] is not None and not math.isfinite(row["loss"])]
            self._nonfinite(step, math.fsum(losses) / len(losses), norm, bad)
        self.opt.zero_grad(set_to_none=True)
        step_s = time.perf_counter() - t0
        self.step = step
        self._peer_stop = max(r["stop"] for r in everyone)
        samples = cfg.data.global_batch * self.batches.tokens_per_sample
        record = {"step": step, "loss": math.fsum(losses) / len(losses), "val_loss": None, "lr": lr, "grad_norm": norm,
                  "tokens_per_s": samples / step_s, "step_s": step_s}
        if measure:
            record.update(self._memory(everyone))
        return record

    def _memory(self, everyone: list[dict[str, Any]]) -> dict[str, Any]:
        """The memory fields of a logged record, per global rank (measured and simulated)."""
        units: dict[int, int] = {}
        kept: dict[int, int] = {}  # bytes a slot still held after its I: W needs only those
        for r in everyone:
            for s, b in r["slots"].items():
                units[s] = max(units.get(s, 0), b)
            for s, b in r["w"].items():
                kept[s] = max(kept.get(s, 0), b)
        sim = self.sim(units, kept)
        ctx = self.ctx
        return {
            "layout": {"pp": ctx.pp, "dp": ctx.dp, "tp": ctx.tp},  # what the per-rank lists index (report splits by it)
            "peak_act_bytes": [r["peak"] for r in everyone],
            "sim_peak_act_bytes": [sim[r["pp_rank"]] for r in everyone],
            "host_bytes": [r["host"] for r in everyone],
            "reload_stall_s": [r["stall"] for r in everyone],
            "cuda_max_allocated": None if everyone[0]["cuda"] is None else [r["cuda"] for r in everyone],
        }

    def _nonfinite(self, step: int, loss: float, norm: float, ranks: list[int] | None = None) -> None:
        """A non-finite loss or gradient norm: the optimizer does not step; past the allowed number of
        skipped steps (``skip_nonfinite``) the run stops before anything non-finite is saved. ``ranks``:
        those whose own loss was not finite."""
        self.skipped += 1
        allowed = self.cfg.optim.skip_nonfinite
        where = f" (not finite on rank {', '.join(map(str, ranks))})" if ranks else ""
        what = f"step {step}: loss {loss:g}{where}, gradient norm {norm:g}: not finite"
        if self.skipped > allowed:
            cfg = self.cfg
            raise NonFiniteError(f"{what}; stopped without saving it (the last checkpoint, if any, is intact); "
                                 f"{_remedy(cfg)}, or allow skipped steps with {setting(cfg, 'skip_nonfinite', 'N')} "
                                 f"({self.skipped - 1} of {allowed} allowed were skipped)")
        if self.ctx.is_main:
            log.warning("%s: the optimizer step was skipped (%d of %d allowed)", what, self.skipped, allowed)

    def _measurements(self, loss: torch.Tensor | None, trace: Any) -> torch.Tensor:
        """This rank's measurements of the step as row ``rank`` of a (world, width) float64 board of
        zeros: summed over the world by ``_gather`` it becomes every rank's (x + 0 is exact; float64
        holds these integers and a float32 loss exactly). ``trace``: a measured step's, or None (only
        the loss and the stop signal)."""
        ctx = self.ctx
        has_loss = loss is not None and ctx.tp_rank == 0
        row = [float(has_loss), float(loss) if has_loss else 0.0, self.stop_signal]  # type: ignore[arg-type]
        if trace is not None:
            cuda = torch.cuda.max_memory_allocated(ctx.device) if ctx.device.type == "cuda" else -1
            row += [trace.peak_bytes, trace.peak_host_bytes, reload_seconds(trace), cuda, ctx.pp_rank]
            n = self.runner.num_stages  # per stage: a slot's bytes, then what one still held after its I (-1: not here)
            row += [self.runner.slot_bytes.get(s, -1) for s in range(n)] + \
                [self.runner.w_bytes.get(s, -1) for s in range(n)]
        board = torch.zeros(ctx.world, len(row), dtype=torch.float64)
        board[ctx.rank] = torch.tensor(row, dtype=torch.float64)
        return board

    def _gather(self, board: torch.Tensor) -> torch.Tensor:
        """Every rank's rows: ``board`` summed over the world by an all-reduce of its own (the gradient
        norm's all-reduce carries the norm only)."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return board
        on_device = board.to(self.ctx.device)  # NCCL reduces device tensors only
        dist.all_reduce(on_device)
        return on_device.cpu()

    @staticmethod
    def _rows(board: torch.Tensor) -> list[dict[str, Any]]:
        out = []
        for row in board.tolist():
            flag, value, stop = row[:_BRIEF]
            r: dict[str, Any] = {"loss": value if flag else None, "stop": int(stop)}
            if len(row) > _BRIEF:
                peak, host, stall, cuda_bytes, pp_rank = row[_BRIEF:_HEAD]
                n = (len(row) - _HEAD) // 2
                r.update({
                    "peak": int(peak), "host": int(host), "stall": stall,
                    "cuda": None if cuda_bytes < 0 else int(cuda_bytes), "pp_rank": int(pp_rank),
                    "slots": {s: int(b) for s, b in enumerate(row[_HEAD:_HEAD + n]) if b >= 0},
                    "w": {s: int(b) for s, b in enumerate(row[_HEAD + n:]) if b >= 0},
                })
            out.append(r)
        return out

    # ---- validation --------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss: the held-out batches through the runner's forward-only schedule
        (``PipelineRunner.evaluate``: the same interpreter, transport and failure handling as a step)."""
        ctx = self.ctx
        total, count, batches = 0.0, 0, 0
        modules = [m for m in self.model.stages.values()]
        for m in modules:
            m.eval()
        try:
            with self._autocast(), ctx.collective(f"evaluating after step {self.step} (pipeline forward)"):
                for inputs, targets in self._val_batches():
                    batches += 1
                    # the losses on the last stage's rank; a failure names the step the evaluation follows
                    for value in self.runner.evaluate(inputs, targets, step=self.step) or []:
                        total += float(value)
                        count += 1
                if not batches:  # every rank reads the same source: all refuse together (else val loss 0.0)
                    raise DataError(f"reading the validation batches after step {self.step} failed on rank "
                                    f"{ctx.rank}: the batches' val(dp_rank={ctx.dp_rank}) gave none, and a "
                                    "validation loss needs at least one held-out batch; fix the data source")
        finally:
            for m in modules:
                m.train()
            if self.fsdp is not None:  # the forwards all-gathered the stages: back to the shards
                self.fsdp.reshard()
        contrib = torch.tensor([total / count if count and ctx.tp_rank == 0 else 0.0], dtype=torch.float64,
                               device=ctx.device)  # NCCL reduces device tensors only
        with ctx.collective(f"reducing the validation loss after step {self.step}"):
            dist.all_reduce(contrib)
        return float(contrib[0]) / ctx.dp

    # ---- the run -----------------------------------------------------------------------------------
    def resume(self, path: Path) -> None:
        with self.ctx.collective(f"loading checkpoint {path.name}"):
            info = checkpoint.load(path, self.named, self.opt, self.ctx.rank, self.ctx.world)
        self.step = int(info["step"])
        # the checkpoint's parameter groups carry the saving run's AdamW options: the config's win
        changed = apply_options(self.opt, self.cfg)
        log.info("resumed from %s at step %d", path, self.step)
        if changed and self.ctx.is_main:
            log.info("AdamW options from step %d on (the checkpoint had others): %s", self.step + 1,
                     ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()))

    def _parameters_finite(self) -> bool:
        """Whether every rank's parameters are finite (one all-reduce: the same answer on every rank)."""
        return self._parameter_extent()[0]

    def _parameter_extent(self) -> tuple[bool, float]:
        """Whether every rank's parameters are finite, and the largest absolute value of the finite ones
        (one all-reduce: the same answer on every rank)."""
        from pipeoffload.train.optim import local_tensor

        bad, largest = False, 0.0
        for p in self.params:
            values = local_tensor(p.detach())
            finite = torch.isfinite(values)
            bad = bad or not bool(finite.all())
            if values.numel():
                largest = max(largest, float(values.abs().where(finite, 0).max()))
        flags = torch.tensor([float(bad), largest], dtype=torch.float64, device=self.ctx.device)
        with self.ctx.collective(f"checking the parameters of step {self.step}"):
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return not flags[0] > 0, float(flags[1])

    def _check_finite_parameters(self) -> None:
        """Refuse to save non-finite weights (an optimizer step can overflow with finite inputs)."""
        if not self._parameters_finite():
            raise NonFiniteError(f"step {self.step}: the parameters are not finite after the optimizer step; stopped "
                                 f"without saving them (the last checkpoint, if any, is intact); {_remedy(self.cfg)}")

    def _nonfinite_validation(self, value: float) -> NonFiniteError:
        """A validation loss that is not finite: the parameters overflowed; or they are finite but the
        learning rate grew them until the forward overflows (the likelier cause once they are large);
        or the model's forward made it on the validation batches. Collective (every rank gets the same
        value)."""
        cfg = self.cfg
        what = f"step {self.step}: validation loss {value:g} is not finite"
        kept = "stopped without saving (the last checkpoint, if any, is intact)"
        finite, largest = self._parameter_extent()
        if not finite:
            return NonFiniteError(f"{what}: the parameters overflowed; stopped without saving them; {_remedy(cfg)}")
        forward = ("the model's forward (in eval mode) gave it on the validation batches: check the forward and the "
                   "validation data for values that overflow or NaN")
        if largest >= _INFLATED:
            return NonFiniteError(f"{what}, but the parameters are finite, up to {largest:.3g} in absolute value: most "
                                  f"likely the learning rate ({setting(cfg, 'lr', f'{cfg.optim.lr:g}')}"
                                  f"{_clip_off(cfg)}) grew them until the forward overflows; {kept}; {_remedy(cfg)}; "
                                  f"if not, {forward}")
        return NonFiniteError(f"{what}, but the parameters are finite (at most {largest:.3g} in absolute value): "
                              f"{forward}; {kept}; if the weights grow from step to step, {_remedy(cfg)}")

    def save(self) -> Path | None:
        assert self.run_dir is not None
        self._check_finite_parameters()
        with self.ctx.collective(f"saving the checkpoint of step {self.step}"):
            path = self.saver.save(self.run_dir, self.step, self.named, self.opt, self.ctx.rank, self.ctx.world, {})
        if self.ctx.is_main:
            if path is None:
                log.info("writing the checkpoint of step %d in the background", self.step)
            else:
                log.info("saved checkpoint %s", path)
        return path

    def _install_signals(self) -> Callable[[], None]:
        def handler(signum: int, _frame: Any) -> None:
            first, self.stop_signal = not self.stop_signal, signum  # set first: a signal during the log says nothing
            if first:
                log.warning("received %s: finishing the step, then saving and exiting", signal.Signals(signum).name)

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        # a signal the launcher forwarded while this rank was starting (ignored or only recorded then)
        from pipeoffload.runtime.launch import pending_signal

        if pending := pending_signal():
            handler(pending, None)

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    def fit(self, resume_from: Path | None = None) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        # before the resume, as a spawned rank records a signal from its start: a SIGTERM while a one-process
        # run loaded its checkpoint raised the CLI's Interrupted inside the load, reported as a checkpoint
        # that "cannot be loaded onto this layout" (exit 2); now the run takes it up after its first step
        restore = self._install_signals()
        try:
            if resume_from is not None:
                self.resume(resume_from)
            loggers = self._open_loggers(resume_from is not None)
        except BaseException:
            restore()
            raise
        # every rank has set up (the loggers' all-reduce was the last wait of start-up): --timeout from here on
        ctx.started()
        end = min(cfg.run.steps, cfg.run.stop_at) if cfg.run.stop_at else cfg.run.steps
        bar, saved_at, stopped = None, -1, 0
        warm_up = self.step + 1 if resume_from is not None else None  # a resumed run's first step warms up again
        try:
            bar = _progress(cfg, ctx, self.step, cfg.run.steps)  # in the try: its failure closes the loggers too
            while self.step < end:
                step = self.step + 1
                evaluating = step % cfg.metrics.eval_every == 0 or step in (1, cfg.run.steps)
                logged = evaluating or step % cfg.metrics.log_every == 0 or step == end
                record = self.train_step(measure=logged)
                if step == warm_up:  # marked on any layout: report leaves it out of the throughput
                    record["resumed"] = True
                if evaluating:
                    record["val_loss"] = self.evaluate()
                    if not math.isfinite(record["val_loss"]):
                        raise self._nonfinite_validation(record["val_loss"])
                if bar is not None:
                    bar.update(1)
                if logged:
                    with doing(ctx.rank, f"logging the metrics of step {step}"):
                        self._log(record, loggers, bar)
                stopped = self._peer_stop
                if self.run_dir and (self.step % cfg.checkpoint.save_every == 0 or self.step == end or stopped):
                    self.save()
                    saved_at = self.step
                if stopped:
                    break
        finally:
            restore()
            for logger in loggers:
                logger.close()
            if bar is not None:
                bar.close()
        with ctx.collective("completing the checkpoint written in the background"):
            self.saver.wait()
        with doing(ctx.rank, "closing the pipeline runner at the end of the run"):
            self.runner.close()  # its heartbeat thread ends before the process group is destroyed
        return {"rank": ctx.rank, "step": self.step, "history": list(self.history) if ctx.is_main else [],
                "interrupted": stopped, "saved_at": saved_at}

    def _open_loggers(self, resuming: bool) -> list[MetricsLogger]:
        """Rank 0's loggers (on resume ``metrics.jsonl`` drops what came after the checkpoint). Every rank
        learns whether that worked (one all-reduce), so a corrupt ``metrics.jsonl`` or a full disk stops
        every rank with rank 0's one line, not the others with a lost connection."""
        loggers: list[MetricsLogger] = []
        failure: Exception | None = None
        if self.ctx.is_main:
            try:
                loggers = make_loggers(self.run_dir, self.cfg.metrics.tensorboard, self.step if resuming else None)
            except (ConfigError, MetricsError) as err:
                failure = err
        flag = torch.tensor([float(failure is not None)], dtype=torch.float64, device=self.ctx.device)
        try:
            with self.ctx.collective("opening the run's metrics.jsonl"):
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        except BaseException:  # a lost peer, a signal: fit() never gets the loggers to close them
            close_loggers(loggers)
            raise
        if failure is not None:
            raise failure
        if flag[0] > 0:
            raise MetricsError("rank 0 could not open the run's metrics.jsonl (see its error)")
        return loggers

    def _log(self, record: dict[str, Any], loggers: list[MetricsLogger], bar: Any) -> None:
        self.history.append(record)
        for logger in loggers:
            logger.log(record)
        if bar is not None:
            bar.set_postfix_str(_postfix(record))
        if self.ctx.is_main:  # one line per logged step in train.log (every rank has the same record)
            log.info("step %d loss %.4f%s lr %.3g tokens/s %.0f peak act %s", record["step"], record["loss"],
                     "" if record["val_loss"] is None else f" val {record['val_loss']:.4f}", record["lr"],
                     record["tokens_per_s"], max(record["peak_act_bytes"]))


def _clip_off(cfg: TrainConfig) -> str:
    return f", clipping off: {setting(cfg, 'clip', '0')}" if cfg.optim.clip == 0 else ""


def _remedy(cfg: TrainConfig) -> str:
    """The fix for a run that diverged: a lower learning rate, and clipping, which ``clip = 0`` turns off
    (raising a max-norm clip would loosen it)."""
    lr = f"lower {setting(cfg, 'lr')} (now {cfg.optim.lr:g})"
    if cfg.optim.clip == 0:
        return f"{lr} or set {setting(cfg, 'clip')} (e.g. {setting(cfg, 'clip', '1.0')}; it is 0, off)"
    return f"{lr} or lower {setting(cfg, 'clip')} (now {cfg.optim.clip:g})"


def _progress(cfg: TrainConfig, ctx: RankContext, initial: int, total: int) -> Any:
    if not (cfg.metrics.progress and ctx.is_main):
        return None
    import threading

    from tqdm import tqdm

    # tqdm's default lock includes a multiprocessing semaphore, which a spawned rank ending with
    # os._exit never releases: the launcher then warned about a leaked semaphore. One process draws.
    tqdm.set_lock(threading.RLock())
    return tqdm(total=total, initial=initial, file=sys.stderr, desc="train", dynamic_ncols=True, leave=True)


def _postfix(record: dict[str, Any]) -> str:
    peak = max(record["peak_act_bytes"]) / 2**20
    return (f"loss {record['loss']:.4f} | {record['tokens_per_s']:.0f} tok/s | {record['step_s']:.2f} s/step | "
            f"peak act {peak:.2f} MiB")
