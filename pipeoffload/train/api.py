"""Train your own model with the same runner: a list of layers (or one module per stage) and a loss.

    from pipeoffload.train import TrainConfig, train_model

    def layers():                        # called on every rank: build the same weights everywhere
        torch.manual_seed(0)
        return [nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)]

    class Batches:                       # the step's (inputs, targets) for one data-parallel replica
        tokens_per_sample = 1
        def train(self, step, dp_rank): ...
        def val(self, dp_rank): return [...]

    def batches(cfg): return Batches()

    if __name__ == "__main__":
        cfg = TrainConfig.build(schedule="1f1b", pp=2, dp=2, nproc=4, microbatches=4, global_batch=32, steps=50)
        train_model(cfg, layers, torch.nn.functional.cross_entropy, batches)

``layers`` returns the whole model as a list of modules, split into ``pp * stages_per_rank``
consecutive stages (as even as possible; ``counts=`` to choose); with ``stage_modules=True`` it
returns one module per stage instead. Every callable must be importable (defined at module level):
ranks are spawned processes. The run directory gets metrics.jsonl, checkpoints and train.log as for
``pipeoffload train``; checkpoints name parameters ``layers.<i>.<name>`` (``stages.<s>.<name>``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.train.config import TrainConfig, validate


def _user_rank(ctx: Any, cfg: TrainConfig, build: Callable[[], Sequence[Any]], loss_fn: Any,
               batches: Callable[[TrainConfig], Any], stage_modules: bool, counts: Sequence[int] | None,
               resume_from: str | None) -> dict[str, Any]:
    from pipeoffload.train.job import lowered_schedule
    from pipeoffload.train.loop import Trainer
    from pipeoffload.train.model import check_user_model, from_layers, from_stage_modules

    schedule = lowered_schedule(cfg)
    modules = list(build())
    check_user_model(modules, schedule.num_stages, counts, stage_modules)  # as before the start (meta may fail)
    modules = [m.to(ctx.device) for m in modules]
    model = from_stage_modules(modules, schedule, ctx.pp_rank) if stage_modules else \
        from_layers(modules, schedule, ctx.pp_rank, counts)
    run_dir = Path(cfg.run.out) if cfg.run.out else None
    data = batches(cfg)
    lacking = [m for m in ("train", "val") if not callable(getattr(data, m, None))]
    lacking += [] if hasattr(data, "tokens_per_sample") else ["tokens_per_sample"]
    if lacking:  # a function's object can only be seen here (a class is checked before the start)
        raise ConfigError(f"batches(cfg) gave a {type(data).__name__} without {', '.join(lacking)}: it must have "
                          ".train(step, dp_rank), .val(dp_rank) and tokens_per_sample (docs/training.md, Your own model)")
    trainer = Trainer(cfg, ctx, schedule, model, loss_fn, data, run_dir)
    return trainer.fit(Path(resume_from) if resume_from else None)


def train_model(cfg: TrainConfig, layers: Callable[[], Sequence[Any]], loss_fn: Callable[[Any, Any], Any],
                batches: Callable[[TrainConfig], Any], *, stage_modules: bool = False,
                counts: Sequence[int] | None = None, resume: str | None = None, extend: bool = False,
                verbose: bool = False) -> dict[str, Any]:
    """Train on ``cfg.world`` ranks (spawned, under torchrun, or this process); returns rank 0's result
    (``history``: the metrics records, ``step``, ``interrupted``). ``resume=RUN_DIR`` continues that run
    in its directory from its last checkpoint (``cfg.out`` is set to it); a ``steps`` other than the
    run's needs ``extend=True``, as ``--extend`` does: it starts a new cosine LR schedule."""
    from pipeoffload.train import checkpoint
    from pipeoffload.train.job import prepare_run
    from pipeoffload.train.launch import run_ranks, under_torchrun

    _check_arguments(cfg, layers, loss_fn, batches)
    if resume:
        cfg = cfg.updated(out=str(resume))
        _check_resume(cfg, Path(resume), extend)
    cfg = validate(cfg.updated(model="own"), data_exists=False, gpt=False)  # config.toml records the kind
    if cfg.world > 1 and not under_torchrun():
        _check_importable(layers=layers, loss_fn=loss_fn, batches=batches)
    _check_model(cfg, layers, stage_modules, counts)
    ckpt = None
    main = not under_torchrun() or _rank0()
    with contextlib.ExitStack() as hold:
        if cfg.run.out or resume:
            cfg, ckpt = prepare_run(cfg, resume, is_main=main, hold=hold)
        del checkpoint
        results = run_ranks(_user_rank, cfg, (layers, loss_fn, batches, stage_modules, counts,
                                              str(ckpt) if ckpt else None), verbose=verbose)
    return results[0]  # type: ignore[no-any-return]


def _check_arguments(cfg: Any, layers: Any, loss_fn: Any, batches: Any) -> None:
    """Refuse, in one line and before any rank starts, arguments of the wrong kind (what would otherwise
    fail in every rank, after the run folder is made, with an AttributeError or "not callable")."""
    if not isinstance(cfg, TrainConfig):
        raise ConfigError(f"cfg: train_model takes a TrainConfig, not a {type(cfg).__name__}; build one with "
                          "TrainConfig.build(schedule='1f1b', pp=2, nproc=2, microbatches=4, global_batch=32, ...)")
    kinds = {"layers": "a function returning the model's list of modules (pass layers, not layers())",
             "loss_fn": "a function loss_fn(output, target) returning a scalar loss (e.g. F.cross_entropy)",
             "batches": "a function or class batches(cfg) giving an object with .train(step, dp_rank) and "
                        ".val(dp_rank)"}
    for name, value in (("layers", layers), ("loss_fn", loss_fn), ("batches", batches)):
        if not callable(value):
            raise ConfigError(f"{name}={_shown(value)}: not callable; give {kinds[name]}")
    if isinstance(batches, type):  # a class: its methods can be checked without building it
        lacking = [m for m in ("train", "val") if not callable(getattr(batches, m, None))]
        if lacking:
            raise ConfigError(f"batches={batches.__name__}: the class has no {' or '.join(f'.{m}()' for m in lacking)}"
                              f"; give {kinds['batches']}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _check_resume(cfg: TrainConfig, run: Path, extend: bool) -> None:
    from pipeoffload.train.config import build_config, load_saved

    if not run.exists():
        raise ConfigError(f"resume={str(run)!r}: no such folder; give the out folder of a run")
    if not (run / "config.toml").is_file():
        raise ConfigError(f"resume={str(run)!r}: no config.toml there; give the out folder of a run")
    saved = build_config(load_saved(run, "resume="))  # (its model is checked by loading the checkpoint into yours)
    if saved.run.steps != cfg.run.steps and not extend:
        raise ConfigError(f"steps={cfg.run.steps}: the run was made with steps={saved.run.steps}, which also sets its "
                          "cosine LR schedule; pass extend=True to start a new LR schedule, or keep steps")


def _check_model(cfg: TrainConfig, build: Callable[[], Sequence[Any]], stage_modules: bool,
                 counts: Sequence[int] | None) -> None:
    """``check_user_model`` before any rank starts, on a copy of the model built on the meta device
    (nothing allocated; the caller's random-number state is kept). A ``layers`` that cannot build on
    meta is checked by the ranks instead, on the modules they build."""
    import torch

    from pipeoffload.train.job import lowered_schedule
    from pipeoffload.train.model import check_user_model

    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            modules = list(build())
    except Exception:  # noqa: BLE001 - e.g. weights read from a file, data-dependent code: the ranks check
        return
    check_user_model(modules, lowered_schedule(cfg).num_stages, counts, stage_modules)


def _check_importable(**callables: Any) -> None:
    """Spawned ranks receive each callable by reference (pickled by name): a lambda or a function
    defined inside another cannot be sent; say so before any rank starts."""
    import pickle

    for name, fn in callables.items():
        try:
            pickle.dumps(fn)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            label = getattr(fn, "__qualname__", type(fn).__name__)
            raise ConfigError(f"{name}={label!r} cannot be sent to the spawned ranks ({str(err).splitlines()[0]}): "
                              "it must be importable, i.e. defined at the top level of a module (not a lambda or a "
                              "function defined inside another)") from None


def _rank0() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"
