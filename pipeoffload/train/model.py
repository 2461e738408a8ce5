"""Models as pipeline stages with the full single-process parameter names.

A model is a list of layers (or of stage modules); the schedule's stage count splits it and its
placement picks this rank's stages. Each rank names its parameters as the whole model would in one
process (``layers.<i>.<name>``, or ``stages.<s>.<name>`` for stage modules), so checkpoints from any
layout hold the same keys and can be resharded or loaded by a single process.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from pipeoffload.ir import Schedule
from pipeoffload.models import GPTConfig, StageModule, even_counts, gpt_layers
from pipeoffload.models.split import check_counts
from pipeoffload.models.tensor_parallel import parallelize_gpt_stage
from pipeoffload.train.config import TrainConfig

log = logging.getLogger(__name__)


@dataclass
class RankModel:
    """This rank's stage modules; ``starts[s]`` is the global index of stage ``s``'s first layer, or
    None when the stages are user modules (named ``stages.<s>.<name>``)."""

    stages: dict[int, nn.Module]
    starts: dict[int, int] | None = None
    tied: TiedCopies | None = None

    def full_name(self, stage: int, local: str) -> str:
        if self.starts is None:
            return f"stages.{stage}.{local}"
        j, _, rest = local.partition(".")
        return f"layers.{self.starts[stage] + int(j)}.{rest}"

    def named_parameters(self) -> dict[str, nn.Parameter]:
        """Full single-process name -> parameter (recomputed: tensor parallelism swaps parameters)."""
        return {self.full_name(s, n): p for s, m in self.stages.items() for n, p in m.named_parameters()}

    def parameters(self) -> list[nn.Parameter]:
        return list(self.named_parameters().values())


@dataclass
class TiedCopies:
    """The two copies of a tied embedding: the token embedding on the first stage, the output head on
    the last (``names``). Both start equal; their gradients are summed (as one shared parameter's would
    be: Megatron's embedding group) before the optimizer, so they stay equal. ``group``: the process
    group of the two ranks holding them (None when this rank holds both or neither)."""

    names: tuple[str, str]
    group: Any = None
    params: list[nn.Parameter] = field(default_factory=list)

    def reduce(self) -> None:
        from pipeoffload.train.optim import local_tensor

        grads = [local_tensor(p.grad) for p in self.params if p.grad is not None]
        if len(grads) == 2:
            total = grads[0] + grads[1]
            for g in grads:
                g.copy_(total)
        elif len(grads) == 1 and self.group is not None:
            import torch.distributed as dist

            dist.all_reduce(grads[0], group=self.group)


def tied_copies(model: RankModel, names: tuple[str, str], schedule: Schedule, ctx: Any) -> TiedCopies:
    """The tied pair of ``model``; creates one group per (dp, tp) coordinate when the first and last
    stages sit on different pipeline ranks (every rank calls ``new_group`` for each, in one order), bounded
    like the mesh's groups (``RankContext.new_group``)."""
    first, last = schedule.placement.rank_of(0), schedule.placement.rank_of(schedule.num_stages - 1)
    named = model.named_parameters()
    tied = TiedCopies(names, params=[named[n] for n in names if n in named])
    if first == last or ctx.world == 1:
        return tied
    for d in range(ctx.dp):
        for t in range(ctx.tp):
            ranks = [(d * ctx.pp + p) * ctx.tp + t for p in (first, last)]
            with ctx.collective("setting up (creating the group of the tied embedding and head)"):
                group = ctx.new_group(ranks)
            if ctx.rank in ranks:
                tied.group = group
    return tied


def gpt_config(cfg: TrainConfig, vocab: int) -> GPTConfig:
    """The reference GPT of ``cfg``; ``vocab``: the tokenizer's, used when the config's ``vocab`` is 0."""
    m = cfg.model
    return GPTConfig(vocab=m.vocab or vocab, seq=m.seq_len, hidden=m.hidden, heads=m.heads, layers=m.layers,
                     max_offset=0)


def full_gpt(cfg: TrainConfig, vocab: int) -> nn.Module:
    """The whole GPT in one process, named as the pipeline ranks name it (``layers.<i>...``)."""
    model = nn.Module()
    model.layers = StageModule(*gpt_layers(gpt_config(cfg, vocab), seed=cfg.run.seed))
    return model


def from_layers(layers: Sequence[nn.Module], schedule: Schedule, pp_rank: int,
                counts: Sequence[int] | None = None) -> RankModel:
    """Split ``layers`` into ``schedule.num_stages`` consecutive stages; keep this pipeline rank's."""
    counts = tuple(counts) if counts is not None else even_counts(len(layers), schedule.num_stages)
    check_counts(counts, len(layers), schedule.num_stages)
    starts = [sum(counts[:s]) for s in range(len(counts))]
    mine = schedule.placement.stages_of(pp_rank)
    stages: dict[int, nn.Module] = {s: StageModule(*layers[starts[s]:starts[s] + counts[s]]) for s in mine}
    return RankModel(stages, {s: starts[s] for s in mine})


def _check_stage_modules(count: int, num_stages: int) -> None:
    if count != num_stages:
        from pipeoffload.errors import ConfigError

        raise ConfigError(f"{count} stage modules for a schedule of {num_stages} stages "
                          "(pp * stages_per_rank): give one module per stage or a list of layers")


def from_stage_modules(modules: Sequence[nn.Module], schedule: Schedule, pp_rank: int) -> RankModel:
    """One module per global stage (all of them, built identically on every rank); keep this rank's."""
    _check_stage_modules(len(modules), schedule.num_stages)
    stages = {s: modules[s] for s in schedule.placement.stages_of(pp_rank)}
    return RankModel(stages)


def check_user_model(modules: Sequence[Any], num_stages: int, counts: Sequence[int] | None,
                     stage_modules: bool) -> None:
    """Refuse, in one line, a model ``train_model`` cannot train as given: an item of the list that is not
    an ``nn.Module``; ``counts`` that do not split the layers into the ``num_stages`` stages (the rule
    of ``split_layers``); a trainable parameter shared by layers of different stages. Such a parameter
    would train wrong: the ranks of its stages each hold a copy whose gradients are never summed, and
    two stages on one rank name it twice (counted twice in the norm, stepped twice by AdamW). Sharing
    within one stage is one parameter of that stage's module and trains as in one process."""
    from pipeoffload.errors import ConfigError

    what = "stage module" if stage_modules else "layer"
    for i, m in enumerate(modules):
        if not isinstance(m, nn.Module):
            name = getattr(m, "__name__", None)
            label = type(m).__name__ + (f" ({name})" if isinstance(name, str) else "")
            raise ConfigError(f"{what} {i} of layers() is a {label}, not a torch.nn.Module: every {what} must be "
                              "a module (wrap a function in an nn.Module of your own, e.g. nn.ReLU() for torch.relu)")
    if stage_modules:
        if counts is not None:
            raise ConfigError("counts= splits a list of layers; with stage_modules=True each module is one stage: "
                              "leave counts out")
        _check_stage_modules(len(modules), num_stages)
        stage_of, prefix = list(range(num_stages)), "stages"
    else:
        if counts is not None:
            try:
                check_counts(tuple(counts), len(modules), num_stages)
            except ConfigError as err:
                raise ConfigError(f"counts={tuple(counts)}: {err}") from None
        else:
            counts = even_counts(len(modules), num_stages)
        stage_of = [s for s, c in enumerate(counts) for _ in range(c)]
        prefix = "layers"
    seen: dict[int, tuple[int, str]] = {}  # parameter -> (stage, full name) of its first appearance
    shared: list[tuple[str, int, str, int]] = []
    for i, m in enumerate(modules):
        for local, p in m.named_parameters():
            first = seen.setdefault(id(p), (stage_of[i], f"{prefix}.{i}.{local}"))
            if first[0] != stage_of[i] and p.requires_grad and not any(x[0] == first[1] for x in shared):
                shared.append((first[1], first[0], f"{prefix}.{i}.{local}", stage_of[i]))
    if shared:
        pairs = "; ".join(f"{a} (stage {sa}) is also {b} (stage {sb})" for a, sa, b, sb in shared[:3])
        more = f" and {len(shared) - 3} more" if len(shared) > 3 else ""
        raise ConfigError(f"a parameter is shared by layers of different stages: {pairs}{more}; that trains wrong "
                          "(copies on different ranks never sum their gradients; two stages on one rank count and "
                          "step it twice): keep separate parameters, or put the layers that share it in one stage"
                          f"{' (counts=)' if not stage_modules else ''}")


def module_counts(cfg: TrainConfig, schedule: Schedule) -> tuple[int, ...] | None:
    """Modules per stage of ``layers_per_stage`` (blocks per stage; the embedding module goes before the
    first stage's blocks and the head after the last's), or None: the modules split evenly."""
    from pipeoffload.train.config import blocks_per_stage

    blocks = blocks_per_stage(cfg, schedule.num_stages)
    if blocks is None:
        return None
    last = len(blocks) - 1
    return tuple(b + (s == 0) + (s == last) for s, b in enumerate(blocks))


def gpt_rank_model(cfg: TrainConfig, vocab: int, schedule: Schedule, pp_rank: int, device: torch.device) -> RankModel:
    layers = [layer.to(device) for layer in gpt_layers(gpt_config(cfg, vocab), seed=cfg.run.seed)]
    return from_layers(layers, schedule, pp_rank, module_counts(cfg, schedule))


def apply_tensor_parallel(model: RankModel, tp_mesh: DeviceMesh, seq_len: int | None = None) -> None:
    """Shard the GPT blocks of each stage over ``tp_mesh`` (column/row parallel, sequence parallel)."""
    for stage in model.stages.values():
        parallelize_gpt_stage(stage, tp_mesh, seq_len=seq_len)


# ---- the Llama family ---------------------------------------------------------------------------------
def llama_rank_model(cfg: TrainConfig, shape: Any, schedule: Schedule, ctx: Any, hf: Any = None,
                     empty: bool = False) -> RankModel:
    """This rank's stages of the Llama model of ``shape``, tensor-parallel over ``ctx``'s tp mesh when
    tp > 1. ``hf``: an ``HFDir`` to read the weights from (each rank reads only its own parameters, a
    tensor-parallel one only its shard); ``empty``: left uninitialised (a checkpoint fills them); else
    drawn from the seed (the whole model, as the GPT's). Tied embeddings become two copies kept equal
    (``TiedCopies``)."""
    from pipeoffload.models.llama import llama_layers, parallelize_llama_stage

    hf_or_empty = hf is not None or empty
    if not hf_or_empty:
        layers = llama_layers(shape, seed=cfg.run.seed, tie=False)
    else:
        with torch.device("meta"):  # nothing allocated until this rank's stages are chosen
            layers = llama_layers(shape, init=False, tie=False)
    model = from_layers(layers, schedule, ctx.pp_rank, module_counts(cfg, schedule))
    for stage in model.stages.values():
        if not hf_or_empty:
            stage.to(ctx.device)
        if ctx.tp > 1:  # every tp rank holds the same weights (or meta tensors): each keeps its shard
            parallelize_llama_stage(stage, ctx.tp_mesh(), shape, seq_len=cfg.model.seq_len)
        if hf_or_empty:
            stage.to_empty(device=ctx.device)
    if hf is not None:
        from pipeoffload.models.hf import load_parameters

        load_parameters(hf, model.named_parameters())
    if shape.tie_embeddings:
        names = ("layers.0.embed_tokens.weight", f"layers.{shape.layers + 1}.lm_head.weight")
        model.tied = tied_copies(model, names, schedule, ctx)
    return model


def full_llama(shape: Any) -> nn.Module:
    """The whole Llama model in one process (uninitialised: a checkpoint fills it), named as the
    pipeline ranks name it; a tied head is a copy of its own (both are in the checkpoint)."""
    from pipeoffload.models.llama import llama_layers

    model = nn.Module()
    with torch.device("meta"):
        model.layers = StageModule(*llama_layers(shape, init=False, tie=False))
    model.to_empty(device="cpu")
    return model
