"""Rank functions for the training tests (importable by spawned processes)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeoffload.train.config import TrainConfig


def gpt_params(ctx: Any, cfg: TrainConfig) -> dict[str, Any]:
    """Train like `pipeoffload train` (no run directory); return this rank's parameters and the history."""
    from pipeoffload.models import lm_loss
    from pipeoffload.train.data import load_corpus
    from pipeoffload.train.job import TokenBatches, lowered_schedule
    from pipeoffload.train.loop import Trainer
    from pipeoffload.train.model import apply_tensor_parallel, gpt_rank_model
    from pipeoffload.train.optim import local_tensor

    corpus, _ = load_corpus(cfg.data.path, cfg.data.tokenizer, Path("."), cfg.model.seq_len, cfg.data.val_fraction)
    schedule = lowered_schedule(cfg)
    model = gpt_rank_model(cfg, corpus.vocab_size, schedule, ctx.pp_rank, ctx.device)
    if cfg.parallel.tp > 1:
        apply_tensor_parallel(model, ctx.tp_mesh())
    trainer = Trainer(cfg, ctx, schedule, model, lm_loss, TokenBatches(corpus, cfg), None)
    result = trainer.fit()
    result["params"] = {n: local_tensor(p).detach().clone() for n, p in trainer.named.items()}
    result["coords"] = (ctx.dp_rank, ctx.pp_rank, ctx.tp_rank)
    return result


# ---- train_model with values that are not plain tensors between stages -----------------------------
class _ToDict(__import__("torch").nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import torch

        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: Any) -> dict[str, Any]:
        return {"h": self.lin(x), "skip": x}


class _FromDict(__import__("torch").nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import torch

        self.lin = torch.nn.Linear(8, 4)

    def forward(self, d: dict[str, Any]) -> Any:
        return self.lin(d["h"] + d["skip"])


def dict_layers() -> list[Any]:
    import torch

    torch.manual_seed(0)
    return [_ToDict(), _FromDict()]


class RandomBatches:
    tokens_per_sample = 1

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

    def _batch(self, seed: int) -> tuple[Any, Any]:
        import torch

        g = torch.Generator().manual_seed(seed)
        return torch.randn(self.cfg.data.global_batch // self.cfg.parallel.dp, 8, generator=g), \
            torch.randint(0, 4, (self.cfg.data.global_batch // self.cfg.parallel.dp,), generator=g)

    def train(self, step: int, dp_rank: int) -> tuple[Any, Any]:
        return self._batch(1000 * step + dp_rank)

    def val(self, dp_rank: int) -> list[tuple[Any, Any]]:
        return [self._batch(10**6 + dp_rank)]


def _dict_trainer(ctx: Any, cfg: TrainConfig, run_dir: str) -> Any:
    import torch.nn.functional as F

    from pipeoffload.train import loop
    from pipeoffload.train.job import lowered_schedule
    from pipeoffload.train.model import from_layers

    schedule = lowered_schedule(cfg)
    model = from_layers([m.to(ctx.device) for m in dict_layers()], schedule, ctx.pp_rank)
    return loop.Trainer(cfg, ctx, schedule, model, F.cross_entropy, RandomBatches(cfg), Path(run_dir))


def logged_and_spied(ctx: Any, cfg: TrainConfig, run_dir: str, spied_cfg: TrainConfig,
                     spied_dir: str) -> dict[str, Any]:
    """Train ``dict_layers`` twice in the same ranks (one spawn): with ``cfg`` into ``run_dir``, then
    with ``spied_cfg`` into ``spied_dir`` under a spy on ``torch.distributed.all_reduce``. Returns
    both results, the element counts of the all-reduces made inside the gradient norm during the
    second, the number of parameter names (the norm's slots), whether each step measured memory, and
    per step the all-reduces it made in order ("norm": the gradient norm's, "other")."""
    import torch.distributed as dist

    from pipeoffload.train import loop

    first = _dict_trainer(ctx, cfg, run_dir).fit()
    trainer = _dict_trainer(ctx, spied_cfg, spied_dir)
    sizes: list[int] = []
    inside = [False]
    in_step: list[list[str]] = []  # per training step, the all-reduces it made: "norm" or "other"
    real_reduce, real_norm = dist.all_reduce, loop.global_grad_norm

    def spy_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if inside[0]:
            sizes.append(tensor.numel())
        if stepping[0]:
            in_step[-1].append("norm" if inside[0] else "other")
        return real_reduce(tensor, *args, **kwargs)

    stepping = [False]
    real_train_step = trainer.train_step

    def spy_train_step(*args: Any, **kwargs: Any) -> Any:
        in_step.append([])
        stepping[0] = True
        try:
            return real_train_step(*args, **kwargs)
        finally:
            stepping[0] = False

    def spy_norm(*args: Any, **kwargs: Any) -> float:
        inside[0] = True
        try:
            return real_norm(*args, **kwargs)
        finally:
            inside[0] = False

    measured: list[bool] = []
    real_step = trainer.runner.step

    def spy_step(*args: Any, measure: bool | None = None, **kwargs: Any) -> Any:
        measured.append(bool(measure))
        return real_step(*args, measure=measure, **kwargs)

    trainer.runner.step = spy_step
    trainer.train_step = spy_train_step  # type: ignore[method-assign]
    dist.all_reduce, loop.global_grad_norm = spy_reduce, spy_norm  # type: ignore[assignment]
    try:
        second = trainer.fit()
    finally:
        dist.all_reduce, loop.global_grad_norm = real_reduce, real_norm  # type: ignore[assignment]
    return {"first": first, "second": second, "sizes": sizes, "slots": len(trainer.order), "measured": measured,
            "in_step": in_step}


class _FailsInEval(__import__("torch").nn.Linear):
    """A layer that trains but raises when evaluated (model.eval())."""

    def forward(self, x: Any) -> Any:
        if not self.training:
            raise RuntimeError("this layer cannot evaluate")
        return super().forward(x)


def eval_failing_layers() -> list[Any]:
    import torch

    torch.manual_seed(0)
    return [torch.nn.Linear(8, 8), _FailsInEval(8, 4)]


class _FailsInSecondStep(__import__("torch").nn.Linear):
    """Raises in the second training step its process runs (2 microbatches a step): whatever step of the
    run that is (after a resume, the checkpoint's step + 2)."""

    forwards = 0

    def forward(self, x: Any) -> Any:
        if self.training:
            type(self).forwards += 1
            if type(self).forwards > 2:
                raise RuntimeError("this layer fails in its second step")
        return super().forward(x)


def second_step_failing_layers() -> list[Any]:
    import torch

    torch.manual_seed(0)
    return [torch.nn.Linear(8, 8), _FailsInSecondStep(8, 4)]


def plain_layers() -> list[Any]:
    """``second_step_failing_layers``' parameters, without the failure."""
    import torch

    torch.manual_seed(0)
    return [torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)]


def parameterless_end_layers() -> list[Any]:
    """With counts (3, 1) the last stage is ``nn.Identity()`` alone: its rank has no parameters."""
    import torch

    torch.manual_seed(0)
    return [torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4), torch.nn.Identity()]


class _NaNWhen(__import__("torch").nn.Linear):
    """A layer whose output is NaN in eval mode (``in_eval``) or in training; its parameters stay finite."""

    in_eval = True

    def forward(self, x: Any) -> Any:
        y = super().forward(x)
        return y * float("nan") if self.training != self.in_eval else y


class _NaNInTraining(_NaNWhen):
    in_eval = False


def nan_in_eval_layers() -> list[Any]:
    import torch

    torch.manual_seed(0)
    return [torch.nn.Linear(8, 8), _NaNWhen(8, 4)]


def nan_in_training_layers() -> list[Any]:
    import torch

    torch.manual_seed(0)
    return [torch.nn.Linear(8, 8), _NaNInTraining(8, 4)]


# ---- --fsdp: several runs on one set of 4 ranks (a spawn costs more than a tiny run) -----------------
class PoisonedLoss:
    """The language-model loss, plus a NaN constant while ``on``: the loss is not finite, its gradients
    are (the constant's derivative is 0), so only the losses, not the gradient norm, say the step must
    be skipped."""

    def __init__(self) -> None:
        self.on = False

    def __call__(self, logits: Any, targets: Any) -> Any:
        from pipeoffload.models import lm_loss

        loss = lm_loss(logits, targets)
        return loss + float("nan") if self.on else loss


def skip_on_a_nan_loss(ctx: Any, cfg: TrainConfig) -> dict[str, Any]:
    """Three steps of the reference GPT with a loss that is NaN (its gradients finite) in the second
    only; returns whether each step moved this rank's parameters, each record's loss and gradient norm,
    and the number of skipped steps."""
    import torch

    from pipeoffload.train.data import load_corpus
    from pipeoffload.train.job import TokenBatches, lowered_schedule
    from pipeoffload.train.loop import Trainer
    from pipeoffload.train.model import gpt_rank_model

    corpus, _ = load_corpus(cfg.data.path, cfg.data.tokenizer, Path("."), cfg.model.seq_len, cfg.data.val_fraction)
    schedule = lowered_schedule(cfg)
    model = gpt_rank_model(cfg, corpus.vocab_size, schedule, ctx.pp_rank, ctx.device)
    loss = PoisonedLoss()
    trainer = Trainer(cfg, ctx, schedule, model, loss, TokenBatches(corpus, cfg), None)
    before = [p.detach().clone() for p in trainer.params]
    moved, records = [], []
    for poisoned in (False, True, False):
        loss.on = poisoned
        record = trainer.train_step(measure=False)
        records.append((record["loss"], record["grad_norm"]))
        after = [p.detach().clone() for p in trainer.params]
        moved.append(any(not torch.equal(a, b) for a, b in zip(before, after)))
        before = after
    return {"moved": moved, "records": records, "skipped": trainer.skipped}


def _train(ctx: Any, cfg: TrainConfig, run_dir: Path | None, resume: Path | None = None) -> dict[str, Any]:
    from pipeoffload.models import lm_loss
    from pipeoffload.train.data import load_corpus
    from pipeoffload.train.job import TokenBatches, lowered_schedule
    from pipeoffload.train.loop import Trainer
    from pipeoffload.train.model import gpt_rank_model

    corpus, _ = load_corpus(cfg.data.path, cfg.data.tokenizer, Path("."), cfg.model.seq_len, cfg.data.val_fraction)
    schedule = lowered_schedule(cfg)
    model = gpt_rank_model(cfg, corpus.vocab_size, schedule, ctx.pp_rank, ctx.device)
    trainer = Trainer(cfg, ctx, schedule, model, lm_loss, TokenBatches(corpus, cfg), run_dir)
    result = trainer.fit(resume)
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in trainer.named.items()}
    trace = trainer.runner.trace
    return {"losses": [h["loss"] for h in result["history"]], "val": [h["val_loss"] for h in result["history"]],
            "norms": [h["grad_norm"] for h in result["history"]],
            "params": full, "sharded": sorted(n for n, p in trainer.named.items() if hasattr(p, "full_tensor")),
            "host_bytes": trace.peak_host_bytes if trace is not None else None}


def fsdp_cases(ctx: Any, cfg: TrainConfig, run_dir: str, cases: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Each case: a name and the flat keys changed from ``cfg`` (``resume_step``: resume from that
    checkpoint of the case named ``resume_of``); every run on these ranks, one after the other."""
    from pipeoffload.train.checkpoint import step_dir
    from pipeoffload.train.config import validate

    out: dict[str, Any] = {}
    for name, keys in cases:
        keys = dict(keys)
        of, at = keys.pop("resume_of", None), keys.pop("resume_step", None)
        case_cfg = validate(cfg.updated(**keys))
        where = Path(run_dir) / name
        where.mkdir(parents=True, exist_ok=True)
        resume = step_dir(Path(run_dir) / of, at) if of else None
        out[name] = _train(ctx, case_cfg, where, resume)
    return out


def step_collectives(ctx: Any, cfg: TrainConfig) -> dict[str, Any]:
    """Train the reference GPT (or ``--model llama``) with tensor parallelism and count, per step, the
    collectives (``CommDebugMode``: c10d and functional, DTensor's redistributes included) inside the
    loop's partial-gradient sum (where it has one), gradient norm, clip and ``opt.step``; the number
    of ``Partial`` gradients the first of them found; and whether every gradient the optimizer read
    had its parameter's placement."""
    from torch.distributed.tensor.debug import CommDebugMode

    from pipeoffload.models import lm_loss
    from pipeoffload.train import loop
    from pipeoffload.train.data import load_corpus
    from pipeoffload.train.family import kind, run_shape
    from pipeoffload.train.job import TokenBatches, lowered_schedule
    from pipeoffload.train.model import apply_tensor_parallel, gpt_rank_model, llama_rank_model
    from pipeoffload.train.optim import is_partial

    corpus, _ = load_corpus(cfg.data.path, cfg.data.tokenizer, Path("."), cfg.model.seq_len, cfg.data.val_fraction)
    schedule = lowered_schedule(cfg)
    if kind(cfg.model.source) == "gpt":
        model = gpt_rank_model(cfg, corpus.vocab_size, schedule, ctx.pp_rank, ctx.device)
        apply_tensor_parallel(model, ctx.tp_mesh(), seq_len=cfg.model.seq_len)
    else:
        model = llama_rank_model(cfg, run_shape(cfg.model, corpus.vocab_size, Path(".")), schedule, ctx, None)
    trainer = loop.Trainer(cfg, ctx, schedule, model, lm_loss, TokenBatches(corpus, cfg), None)
    counts: dict[str, list[int]] = {}
    placements_kept: list[bool] = []
    partial: list[int] = []
    names = [n for n in ("replicate_partial_gradients", "global_grad_norm", "clip_gradients") if hasattr(loop, n)]

    def counted(name: str, fn: Any) -> Any:
        def inner(*args: Any, **kwargs: Any) -> Any:
            if name == names[0]:  # the first after the pipeline's step: the gradients as backward left them
                partial.append(sum(1 for p in trainer.params if p.grad is not None and is_partial(p.grad)))
            if name == "opt.step":
                placements_kept.append(all(p.grad.placements == p.placements for p in trainer.params
                                           if p.grad is not None and hasattr(p, "placements")))
            mode = CommDebugMode()
            with mode:
                out = fn(*args, **kwargs)
            counts.setdefault(name, []).append(mode.get_total_counts())
            return out
        return inner

    real = {n: getattr(loop, n) for n in names}
    for n in names:
        setattr(loop, n, counted(n, real[n]))
    trainer.opt.step = counted("opt.step", trainer.opt.step)  # type: ignore[method-assign]
    try:
        trainer.fit()
    finally:
        for n in names:
            setattr(loop, n, real[n])
    return {"counts": counts, "placements_kept": placements_kept, "partial": partial}
