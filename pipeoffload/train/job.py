"""``pipeoffload train``: the launcher side (prepare the run, start the ranks) and the rank side (GPT).

The launcher validates the whole config, creates the run directory (``config.toml``, the BPE
tokenizer when asked), verifies a checkpoint to resume from, and only then starts ranks.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import write_atomic
from pipeoffload.train import checkpoint
from pipeoffload.train.config import (
    ARITHMETIC_LAYOUT_KEYS,
    TrainConfig,
    layout,
    offload_policy,
    schedule_options,
    setting,
    to_toml,
)
from pipeoffload.train.launch import under_torchrun
from pipeoffload.train.runlock import RunLock

log = logging.getLogger(__name__)


def lowered_schedule(cfg: TrainConfig) -> Any:
    """The run's lowered schedule: the copies planned against one forward per stage as the time unit and
    the run's ``offload_ratio`` (k) for the copies."""
    from pipeoffload.costs import CostModel
    from pipeoffload.passes.lower import lower_with_report

    k = cfg.schedule.offload_ratio
    costs = CostModel().with_offload_ratio(k) if k else None
    return lower_with_report(_schedule(cfg), costs, offload=offload_policy(cfg), recompute=cfg.schedule.recompute,
                             log_warnings=False)[0]


def _schedule(cfg: TrainConfig) -> Any:
    """The run's compute-only schedule."""
    from pipeoffload.schedules import generate

    s = cfg.schedule
    return generate(s.family, cfg.parallel.pp, s.microbatches, s.stages_per_rank, **schedule_options(cfg))


def offload_note(cfg: TrainConfig) -> str | None:
    """One line when the copy lane leaves on the device activations that instant copies would take
    off it: at a large k (a small model's copies take many forwards) it hides few or none, and the
    run then measures little or no host memory where a plan may have promised some."""
    s = cfg.schedule
    if s.offload == "none" or not s.offload_ratio:
        return None

    from pipeoffload.passes.lower import copies_made

    done, possible = copies_made(_schedule(cfg), offload_policy(cfg), s.recompute, s.offload_ratio)
    if done >= possible:
        return None
    return (f"offload={s.offload} at offload_ratio={s.offload_ratio:g}: the copy lane hides {done or 'none'} of the "
            f"{possible} activation windows instant copies would take off the device (a copy takes "
            f"{s.offload_ratio:g} forwards of a stage in this run's plan), so {possible - done} stay on the device; "
            "a smaller --offload-ratio plans the copies for a faster link (0: instant)")


class TokenBatches:
    """Batches of the reference GPT from a ``Corpus``: inputs ``(tokens, None, 0)``, next-token targets."""

    def __init__(self, corpus: Any, cfg: TrainConfig, main: bool = False) -> None:
        self.corpus, self.cfg = corpus, cfg
        self.tokens_per_sample = cfg.model.seq_len
        asked, gb = cfg.metrics.eval_batches, cfg.data.global_batch
        held = corpus.val_batches_held(gb)
        if main and asked > held:  # known once the text is tokenized (in the ranks): capped, said once
            log.warning("eval_batches=%d: the held-out data holds %d batch%s of global_batch=%d sequences (%d "
                        "sequences of seq_len=%d); each validation evaluates %d (lower --eval-batches, or raise "
                        "--val-fraction)", asked, held, "" if held == 1 else "es", gb, corpus.num_val,
                        cfg.model.seq_len, held)

    def _torch(self, x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        import torch

        return (torch.from_numpy(x), None, 0), torch.from_numpy(y)

    def train(self, step: int, dp_rank: int) -> tuple[Any, Any]:
        c = self.cfg
        return self._torch(*self.corpus.train_batch(step, c.data.global_batch, c.run.seed, c.parallel.dp,
                                                    dp_rank))

    def val(self, dp_rank: int) -> list[tuple[Any, Any]]:
        c = self.cfg
        batches = self.corpus.val_batches(c.metrics.eval_batches, c.data.global_batch, c.parallel.dp, dp_rank)
        return [self._torch(x, y) for x, y in batches]


LOADING = "loading the training data"  # what a rank's error at start-up names
BUILDING = "building its stages of the model"


def gpt_rank(ctx: Any, cfg: TrainConfig, resume_from: str | None) -> dict[str, Any]:
    """One rank of a GPT run (called by ``launch.run_ranks``)."""
    from pipeoffload.models import lm_loss
    from pipeoffload.train.data import load_corpus
    from pipeoffload.train.loop import Trainer
    from pipeoffload.train.mesh import doing
    from pipeoffload.train.model import apply_tensor_parallel, gpt_rank_model

    run_dir = Path(cfg.run.out)
    with doing(ctx.rank, LOADING):
        corpus, _ = load_corpus(cfg.data.path, cfg.data.tokenizer, run_dir, cfg.model.seq_len, cfg.data.val_fraction)
    with doing(ctx.rank, BUILDING):
        schedule = lowered_schedule(cfg)
        model = gpt_rank_model(cfg, corpus.vocab_size, schedule, ctx.pp_rank, ctx.device)
        if cfg.parallel.tp > 1:
            apply_tensor_parallel(model, ctx.tp_mesh(), seq_len=cfg.model.seq_len)
    trainer = Trainer(cfg, ctx, schedule, model, lm_loss, TokenBatches(corpus, cfg, ctx.is_main), run_dir)
    return trainer.fit(Path(resume_from) if resume_from else None)


def llama_rank(ctx: Any, cfg: TrainConfig, resume_from: str | None) -> dict[str, Any]:
    """One rank of a Llama-family run (``--model llama`` or ``hf:DIR``)."""
    from pipeoffload.hfdir import open_hf_dir
    from pipeoffload.models import lm_loss
    from pipeoffload.train.data import load_corpus
    from pipeoffload.train.family import hf_path, run_shape
    from pipeoffload.train.loop import Trainer
    from pipeoffload.train.mesh import doing
    from pipeoffload.train.model import llama_rank_model

    run_dir = Path(cfg.run.out)
    with doing(ctx.rank, LOADING):
        corpus, _ = load_corpus(cfg.data.path, cfg.data.tokenizer, run_dir, cfg.model.seq_len, cfg.data.val_fraction)
    with doing(ctx.rank, BUILDING):
        schedule = lowered_schedule(cfg)
        shape = run_shape(cfg.model, corpus.vocab_size, run_dir)
        path = hf_path(cfg.model.source)
        hf = None
        if path is not None and not resume_from:  # the launcher compared a tied head with the embedding already
            hf = open_hf_dir(path, check_tokenizer=False, compare_tied_head=False)
        model = llama_rank_model(cfg, shape, schedule, ctx, hf, empty=bool(resume_from))
    trainer = Trainer(cfg, ctx, schedule, model, lm_loss, TokenBatches(corpus, cfg, ctx.is_main), run_dir)
    return trainer.fit(Path(resume_from) if resume_from else None)


def rank_fn(cfg: TrainConfig) -> Any:
    from pipeoffload.train.family import kind

    return gpt_rank if kind(cfg.model.source) == "gpt" else llama_rank


# ---- launcher ---------------------------------------------------------------------------------------
def default_out() -> str:
    return f"runs/{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run(cfg: TrainConfig, resume: str | None, is_main: bool = True,
                hold: contextlib.ExitStack | None = None,
                announce: Callable[[TrainConfig], None] | None = None) -> tuple[TrainConfig, Path | None]:
    """Create the run directory (rank 0 / the launcher) and find the checkpoint to resume from. With
    ``hold`` the main process locks the run directory (``RunLock``, released when ``hold`` closes)
    once the input is checked and before anything is written; ``announce`` (the CLI prints the
    configuration) is called once every check has passed, so a refusal is one line alone."""
    from pipeoffload.train.data import check_tokenizer_file, prepare
    from pipeoffload.train.metrics import check_records, discard_earlier
    from pipeoffload.train.preflight import check_run

    if not cfg.run.out:
        cfg = cfg.updated(out=default_out())
    check_run(cfg, own_model=cfg.model.source == "own")  # data, memory, --out: before anything is written
    run_dir = Path(cfg.run.out)
    if hold is not None and is_main:  # one run per run directory
        hold.enter_context(RunLock(run_dir))
    ckpt: Path | None = None
    own = cfg.model.source == "own"  # train_model: its remedies in keywords, not flags
    resume_as = "resume=" if own else "--resume"
    if not resume and checkpoint.list_checkpoints(run_dir):
        again = f"resume={cfg.run.out!r}" if own else f"--resume {cfg.run.out}"
        raise ConfigError(f"out={cfg.run.out!r} already holds the checkpoints of a run: continue it with {again}, "
                          f"or pick another {setting(cfg, 'out')}")
    if resume:
        ckpt = checkpoint.latest_checkpoint(Path(resume))
        manifest = checkpoint.verify(ckpt)
        checkpoint.check_compatible(manifest, cfg, ckpt)
        check_records(Path(resume) / "metrics.jsonl", manifest["step"])  # rank 0 rewrites it up to the step
        if manifest["step"] >= cfg.run.steps:
            step = manifest["step"]
            further = "steps=N and extend=True" if own else "--steps N --extend"
            raise ConfigError(f"{resume_as}: the run is finished: checkpoint {ckpt.name} is at step {step} and "
                              f"steps={cfg.run.steps}; to train further pass {further} with N above {step} "
                              "(a new cosine LR schedule over N steps)")
        if 0 < cfg.run.stop_at <= manifest["step"]:
            step = manifest["step"]
            raise ConfigError(f"stop_at={cfg.run.stop_at}: checkpoint {ckpt.name} of {resume_as} is already at step "
                              f"{step}, so the run would train nothing; give {setting(cfg, 'stop_at')} above {step} "
                              f"(up to steps={cfg.run.steps}), or leave it out")
        _note_reshard(manifest, cfg, ckpt)
    check_tokenizer_file(cfg.data.tokenizer, cfg.data.path, run_dir)  # before config.toml is rewritten
    if announce is not None:
        announce(cfg)
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "config.toml", to_toml(cfg))
        if not resume:  # an earlier run's records (it saved no checkpoint) are replaced, with a warning
            discard_earlier(run_dir / "metrics.jsonl")
        _copy_model_files(cfg, run_dir)
        prepare(cfg.data.path, cfg.data.tokenizer, run_dir, cfg.data.val_fraction)
    return cfg, ckpt


def _copy_model_files(cfg: TrainConfig, run_dir: Path) -> None:
    """An ``hf:DIR`` run keeps DIR's config.json and tokenizer.json, and its generation_config.json where it has
    one (``generate`` and ``export`` read the run alone); a resumed run keeps its own copies."""
    from pipeoffload.hfdir import GENERATION_CONFIG
    from pipeoffload.train.family import HF_CONFIG, hf_path

    path = hf_path(cfg.model.source)
    if path is None:
        return
    for src, dst in (("config.json", HF_CONFIG), ("tokenizer.json", "tokenizer.json"),
                     (GENERATION_CONFIG, GENERATION_CONFIG)):
        if not (run_dir / dst).is_file() and (src != GENERATION_CONFIG or (path / src).is_file()):
            write_atomic(run_dir / dst, (path / src).read_bytes())


def _note_reshard(manifest: dict[str, Any], cfg: TrainConfig, ckpt: Path) -> None:
    """Say so when the checkpoint was written on another layout (DCP reshards it by parameter name).
    Only the parallel degrees change the arithmetic; a new schedule or stage split moves the stages
    but computes the same sums in the same order (the tied embedding's two copies add as a + b on one
    rank or two), so such a resume stays bitwise and is only noted in the log."""
    before, now = manifest.get("layout", {}), layout(cfg)
    changed = [k for k in now if k in before and before[k] != now[k]]
    if not changed:
        return
    was, becomes = (" ".join(f"{k}={side[k]}" for k in changed) for side in (before, now))
    if any(k in ARITHMETIC_LAYOUT_KEYS for k in changed):
        log.warning("resuming %s on another layout: resharding from %s to %s; the losses from here on equal an "
                    "uninterrupted run's up to float rounding (sums run in another order), not bitwise (that "
                    "needs the same %s)", ckpt.name, was, becomes, "/".join(ARITHMETIC_LAYOUT_KEYS))
    else:
        log.info("resuming %s with the stages placed anew: resharding from %s to %s; the arithmetic is the same, "
                 "so the losses continue bitwise", ckpt.name, was, becomes)


def train(cfg: TrainConfig, resume: str | None = None, verbose: bool = False,
          announce: Callable[[TrainConfig], None] | None = None) -> dict[str, Any]:
    """Run ``pipeoffload train`` from a validated config; returns rank 0's result. ``announce``: see
    ``prepare_run``."""
    import os

    from pipeoffload.train.launch import run_ranks

    main = not under_torchrun() or os.environ.get("RANK") == "0"
    with contextlib.ExitStack() as hold:
        with _progress_on_stderr(main):
            cfg, ckpt = prepare_run(cfg, resume, is_main=main, hold=hold, announce=announce)
            if not under_torchrun():
                log.info("%s", starting_line(cfg.world, Path(cfg.run.out) / "train.log"))
        if under_torchrun() and not main:
            _wait_for(Path(cfg.run.out) / "config.toml", cfg.run.startup_timeout)
        results = run_ranks(rank_fn(cfg), cfg, (str(ckpt) if ckpt else None,), verbose=verbose)
    first = results[0]
    first["out"] = cfg.run.out
    return first  # type: ignore[no-any-return]


def starting_line(world: int, log_file: Path) -> str:
    """What the launcher says before its ranks start (one rank is "1 rank", not "1 ranks", with "its log")."""
    who = "1 rank (it imports" if world == 1 else f"{world} ranks (each imports"
    return (f"starting {who} torch and joins the process group; on a busy machine this takes a while); "
            f"{'its' if world == 1 else 'their'} log: {log_file}")


@contextlib.contextmanager
def _progress_on_stderr(main: bool) -> Any:
    """While the launcher prepares (a BPE to train, ranks to start: minutes on a big corpus or a busy
    machine), its INFO lines go to stderr, so the terminal says what is happening; the ranks log
    through their own handlers (``launch.setup_logging``) afterwards."""
    logger = logging.getLogger("pipeoffload.train")
    if not main or logger.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("pipeoffload train: %(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # else the CLI's root handler prints each line a second time
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _wait_for(path: Path, timeout: float) -> None:
    """Non-zero torchrun ranks wait for rank 0 to create the run directory (shared file system)."""
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            raise ConfigError(f"{path} did not appear within --startup-timeout {timeout:g} s: is --out on a file system "
                              "every node shares?")
        time.sleep(0.1)
