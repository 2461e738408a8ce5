"""Write a plan as a train config (``pipeoffload train --config run.toml``).

The train config's sections (``pipeoffload.train.config``, which this layer does not import; a test
reads what is written here with train's own reader): ``[schedule]`` family, stages_per_rank,
group_size (group-interleaved only), offload, offload_ratio (the k of the plan's layers and link, when
it offloads), max_stall (a stall budget's plan only), recompute, microbatches; ``[parallel]`` pp, dp,
tp, nproc; ``[data]`` global_batch; and ``[model]`` source = "hf:DIR" and seq_len when the model was read
from a local Hugging Face directory (train builds it from the same config.json), else
layers/hidden/heads/vocab/seq_len of the reference GPT when the model is GPT-shaped (multi-head attention,
head width hidden / heads, FFN 4h, GeLU), or source = "llama" with the Llama keys (kv_heads,
ffn_hidden, vocab, rope_theta) when it is one train's Llama family builds (SwiGLU, no biases), since
that is the model the train command builds; and ``[model] dtype``, the dtype planned. ``plan --emit`` plans
the run the file starts (``train_model``, ``train_setup``): train's blocks in that dtype and train's
optimizer state, as ``train --plan auto`` plans it.
``plan_config`` gives the same keys flat (the train flags with ``-`` as ``_``).
The recompute policy is written as the plan's table shows it, less a partial (LGD) form the plan chose
(``plan --recompute lgd``), which ``train`` does not perform and refuses: the file and the command
returned say so.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeoffload.errors import ConfigError, Naming
from pipeoffload.fileio import write_atomic
from pipeoffload.llama_config import PRESETS, LlamaShape
from pipeoffload.planner.evaluate import placement_of
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.plans import Plan, PlanRequest
from pipeoffload.planner.report import memory_text
from pipeoffload.planner.split import layer_split
from pipeoffload.planner.stagecosts import TrainingSetup, head_weight, layer_copy_and_compute, setup_layer_costs
from pipeoffload.policies import RecomputePolicy

DTYPES = {"bf16": 2, "fp32": 4}  # train's [model] dtype -> bytes of an activation element (bf16: autocast's)


def is_gpt_like(model: ModelSpec) -> bool:
    return (not model.gated_mlp and model.num_kv_heads == model.heads and model.ffn_size == 4 * model.hidden
            and model.attention_width == model.hidden)  # train's GPT has head_dim = hidden / heads


def is_llama_like(model: ModelSpec) -> bool:
    """What train's ``--model llama`` builds from its keys: SwiGLU, no biases, head width hidden / heads
    (Qwen2's q/k/v biases, Llama's attention and MLP biases, Qwen3's q/k norms and a set-apart head_dim have no
    train key)."""
    extras = model.qkv_bias or model.o_bias or model.mlp_bias or model.qk_norm
    return model.gated_mlp and not model.bias and not extras and model.attention_width == model.hidden


def carries_model(model: ModelSpec) -> bool:
    """Whether the train config can hold ``model``: a Hugging Face folder, or keys train builds it from."""
    return bool(model.source) or is_gpt_like(model) or is_llama_like(model)


def _llama_keys(model: ModelSpec) -> dict[str, object]:
    """train's llama keys of ``model``; the RoPE base of the preset of that name (it does not change
    the plan, but it is the model's)."""
    keys: dict[str, object] = {"model": "llama", "layers": model.layers, "hidden": model.hidden,
                               "heads": model.heads, "kv_heads": model.num_kv_heads, "ffn_hidden": model.ffn_size,
                               "vocab": model.vocab, "seq_len": model.seq}
    shape = PRESETS.get(model.name)
    if shape is not None:
        keys["rope_theta"] = shape.rope_theta
    if model.tied_embeddings:
        keys["tie_embeddings"] = True
    return keys


def dtype_name(model: ModelSpec) -> str:
    """train's ``[model] dtype`` of the activations ``model`` was planned with."""
    return next((name for name, size in DTYPES.items() if size == model.dtype_bytes), "fp32")


def train_blocks(model: ModelSpec, dtype_bytes: int) -> ModelSpec:
    """``model`` as ``train`` runs it: train's blocks (``planner.trainblocks``) of the family it builds, with
    its attention (GPT: written out, keeping the s x s scores; Llama-family: SDPA), no dropout, activations
    of ``dtype_bytes`` (2: bf16 autocast). ``train --plan auto`` and ``plan --emit`` both plan with this."""
    family = "llama" if model.source or model.gated_mlp else "gpt"
    return model.with_(blocks=family, flash_attention=family == "llama", dropout=False, dtype_bytes=dtype_bytes)


def train_setup(distributed_optimizer: bool = False) -> TrainingSetup:
    """The state ``train`` keeps per parameter: fp32 weights and gradients in either dtype (bf16 is autocast,
    so there is no separate fp32 master copy) and AdamW's two fp32 moments, sharded over the dp replicas
    only with ``zero`` or ``fsdp`` (``distributed_optimizer``); no LGD partial recomputation, which train
    does not perform (the planner's default assumes it on every plan that offloads)."""
    return TrainingSetup(weight_bytes=4.0, grad_bytes=4.0, optimizer_bytes=8.0,
                         distributed_optimizer=distributed_optimizer, partial_recompute=False)


# what a setup may describe that train does not run: (field, the value that says it, its flag, why); a config
# written from it would plan memory the run does not keep, so ``emit`` refuses each (``check_emit_setup``)
NOT_TRAIN = (
    ("partial_recompute", True, "--partial-recompute", "train does not perform partial (LGD) recomputation"),
    ("sequence_parallel", False, "--no-sequence-parallel", "train's tensor parallelism is always sequence-parallel"),
    ("selective_recompute", True, "--recompute selective", "train does not perform Megatron's selective recomputation"),
)


def check_emit_setup(setup: TrainingSetup) -> None:
    """Refuse (one line naming the field, or the flag for the CLI) a setup train does not run: ``plan --emit``
    and ``PlanResult.emit`` both write a config for train, whose run would not be the one planned
    (``distributed_optimizer`` and ``partial_recompute=False`` are train's run, so they pass)."""
    found = next((entry for entry in NOT_TRAIN if getattr(setup, entry[0]) is entry[1]), None)
    if found is None:
        return
    name, value, flag, why = found

    def words(naming: Naming) -> str:
        if naming.flags:
            return (f"{flag} with --emit: {why}, and --emit plans the run the file starts; drop {flag}, or drop "
                    "--emit to plan a run train does not make")
        return (f"setup.{name}={value} with emit(): {why}, and emit() writes the run the file starts; plan with "
                "setup=pipeoffload.planner.emit.train_setup(), or do not emit a plan train does not make")

    raise ConfigError.named(words)


def train_model(model: ModelSpec, dtype: str) -> ModelSpec:
    """The model a train config written from ``model`` trains, as ``train --plan auto`` plans it
    (``train.plan.planner_model``): a Hugging Face folder as read; a GPT-shaped model as train's reference
    GPT (no biases apart, learned positions and untied head as train builds it); a Llama-shaped one from
    train's llama keys; anything else (not carried: the file says so) only with train's blocks."""
    if not model.source and is_gpt_like(model):
        model = ModelSpec(name=model.name, layers=model.layers, hidden=model.hidden, heads=model.heads,
                          seq=model.seq, vocab=model.vocab, microbatch=model.microbatch)
    elif not model.source and is_llama_like(model):
        keys = _llama_keys(model)
        model = LlamaShape(vocab=model.vocab, hidden=model.hidden, layers=model.layers, heads=model.heads,
                           kv_heads=model.num_kv_heads, ffn_hidden=model.ffn_size,
                           tie_embeddings=model.tied_embeddings, max_positions=max(model.seq, 1),
                           rope_theta=float(keys.get("rope_theta", 10000.0))  # type: ignore[arg-type]
                           ).model_spec(model.name, model.seq).with_(microbatch=model.microbatch)
    return train_blocks(model, DTYPES[dtype])


def _model_note(model: ModelSpec) -> str | None:
    """The comment saying what of the model the file cannot carry, or None."""
    if carries_model(model):
        shape = None if model.source else PRESETS.get(model.name)
        if is_llama_like(model) and shape is not None and shape.rope_scaling is not None:
            return (f"# {model.name}'s Llama 3.1 RoPE scaling has no train key: train uses plain RoPE with "
                    "rope_theta (the plan does not depend on it)")
        return None
    return ("# the model is not one train builds from keys (GPT, or Llama without biases): its shape is left to "
            "the train defaults; plan its Hugging Face folder instead (plan --model hf:DIR --emit ...)")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def train_recompute(policy: RecomputePolicy) -> RecomputePolicy:
    """``policy`` as train runs it: without a partial (LGD) form, which train does not perform and refuses
    (``config_toml`` and ``emit`` say so)."""
    return replace(policy, partial_saving=0.0, partial_time=0.0) if policy.partial else policy


def _partial_note(plan: Plan) -> str | None:
    policy = plan.choice.recompute
    if not policy.partial:
        return None
    return (f"recompute={policy} is written as recompute = \"{train_recompute(policy)}\": train does not perform "
            "partial (LGD) recomputation, so the run keeps more activation memory than this plan predicts (plan "
            "without ',lgd' in --recompute for a prediction train keeps)")


def plan_config(req: PlanRequest, plan: Plan) -> dict[str, object]:
    """The train-config keys of ``plan`` (in the schema's order)."""
    c, layout = plan.choice, plan.layout
    config: dict[str, object] = {"schedule": c.family, "stages_per_rank": c.stages_per_rank}
    if c.group_size is not None:
        config["group_size"] = c.group_size
    config["offload"] = str(c.offload)
    if c.offload.kind != "none":  # train plans the copies for the link the plan was made for
        config["offload_ratio"] = round(offload_ratio(req, plan), 4)
    if c.offload.max_stall > 0:
        config["max_stall"] = c.offload.max_stall
    config["recompute"] = str(train_recompute(c.recompute))
    config.update({"pp": layout.pp, "dp": layout.dp, "tp": layout.tp, "microbatches": plan.microbatches,
                   "global_batch": req.global_batch})
    if layout.pp > 1:  # the split the plan was costed with, which train's even split of modules is not
        config["layers_per_stage"] = ",".join(map(str, plan_split(req, plan)))
    model = req.model
    if model.source:
        config.update({"model": model.source, "seq_len": model.seq})
    elif is_gpt_like(model):
        # vocab too: without it train's GPT takes its tokenizer's (256 bytes), not the vocabulary planned
        config.update({"layers": model.layers, "hidden": model.hidden, "heads": model.heads,
                       "vocab": model.vocab, "seq_len": model.seq})
    elif is_llama_like(model):
        config.update(_llama_keys(model))
    if carries_model(model):  # the activations planned: train's default (fp32) is not bf16's
        config["dtype"] = dtype_name(model)
    config["nproc"] = layout.gpus
    return config


def plan_split(req: PlanRequest, plan: Plan) -> tuple[int, ...]:
    """Transformer blocks per stage as the plan's costs split them (``PlanRequest.split``)."""
    lgd = req.setup.lgd_for(plan.choice.offload)
    lc = req.measured or setup_layer_costs(req.model, req.hardware, plan.layout.tp, req.setup, lgd)
    return layer_split(req.split, req.model.layers, placement_of(plan.choice, plan.layout.pp), head_weight(lc))


def run_copies(req: PlanRequest, plan: Plan) -> tuple[int, int]:
    """(activation windows the run's copy lane takes off the device, windows instant copies would) for the
    plan as ``train`` runs it: the runtime lowers the schedule against one forward per stage and the plan's
    k (``passes.lower.copies_made``, as ``train.job.offload_note`` counts them), not against the planner's timeline, whose idle time (a small model's
    pipeline is mostly p2p latency) hides copies the run never makes. (0, 0) for a plan without offload."""
    from pipeoffload.passes.lower import copies_made
    from pipeoffload.schedules import generate

    c = plan.choice
    if c.offload.kind == "none":
        return 0, 0
    options = {"group_size": c.group_size} if c.group_size else {}
    schedule = generate(c.family, plan.layout.pp, plan.microbatches, c.stages_per_rank, **options)
    return copies_made(schedule, c.offload, train_recompute(c.recompute), offload_ratio(req, plan))


def run_keeps_plan(req: PlanRequest, plan: Plan) -> bool:
    """Whether the run of ``plan`` makes every copy the plan's memory counts on: its copy lane hides all the
    windows instant copies would (``run_copies``). Where it does not, the run keeps more activation memory
    on the device than the plan says, and its host memory is not the plan's."""
    done, possible = run_copies(req, plan)
    return done >= possible


def offload_ratio(req: PlanRequest, plan: Plan) -> float:
    """The k of ``plan``'s layers on its GPU and link, as train's cost model takes it (both copies of
    one layer's activation over that layer's F + I + W time). For train's blocks (``req.setup``) it is
    above what ``pipeoffload k`` prints, which costs the formulas' layer."""
    lc = setup_layer_costs(req.model, req.hardware, plan.layout.tp, req.setup, req.setup.lgd_for(plan.choice.offload))
    copy, compute = layer_copy_and_compute(lc, req.hardware)
    return copy / compute


# flat key -> (section, key) of the train config
SECTIONS = {"schedule": ("schedule", "family"), "stages_per_rank": ("schedule", "stages_per_rank"),
            "group_size": ("schedule", "group_size"), "offload": ("schedule", "offload"),
            "offload_ratio": ("schedule", "offload_ratio"), "max_stall": ("schedule", "max_stall"),
            "recompute": ("schedule", "recompute"), "microbatches": ("schedule", "microbatches"),
            "pp": ("parallel", "pp"), "dp": ("parallel", "dp"), "tp": ("parallel", "tp"),
            "nproc": ("parallel", "nproc"), "global_batch": ("data", "global_batch"),
            "layers": ("model", "layers"), "hidden": ("model", "hidden"), "heads": ("model", "heads"),
            "seq_len": ("model", "seq_len"), "model": ("model", "source"), "kv_heads": ("model", "kv_heads"),
            "ffn_hidden": ("model", "ffn_hidden"), "vocab": ("model", "vocab"), "rope_theta": ("model", "rope_theta"),
            "tie_embeddings": ("model", "tie_embeddings"), "dtype": ("model", "dtype"),
            "layers_per_stage": ("parallel", "layers_per_stage")}


def _sections(config: dict[str, object]) -> list[str]:
    tables: dict[str, list[str]] = {}
    for flat, value in config.items():
        section, name = SECTIONS[flat]
        tables.setdefault(section, []).append(f"{name} = {_toml_value(value)}")
    return [line for section, rows in tables.items() for line in ("", f"[{section}]", *rows)]


def config_toml(req: PlanRequest, plan: Plan) -> str:
    lines = [f"# written by pipeoffload plan: {plan.layout} {plan.choice.label()}, "
             f"{plan.tokens_per_second:,.0f} tokens/s predicted, {memory_text(plan.memory.total)}/GPU",
             f"# model {req.model.name} on {req.gpus} x {req.hardware.name}"]
    offload = plan.choice.offload
    if offload.kind == "budget" and not offload.rank_units and plan.unit_bytes:
        units = offload.budget
        lines.append(f"# offload budget:{units:g} is in activation units (one microbatch of the largest stage: "
                     f"{memory_text(plan.unit_bytes, 3)} here), i.e. {memory_text(units * plan.unit_bytes)}")
    note = _model_note(req.model)
    if note:
        lines.append(note)
    if req.setup.lgd_for(offload) and req.measured is None:
        parts = ("RMSNorm and SwiGLU" if req.model.gated_mlp else "LayerNorm, GeLU") + (
            ", dropout" if req.model.dropout else "")
        lines.append(f"# memory predicted with LGD partial recomputation ({parts} recomputed in the backward), "
                     "which train does not perform: expect more activation memory")
    partial = _partial_note(plan)
    if partial:
        lines.append(f"# {partial}")
    copies = _copies_note(req, plan)
    if copies:
        lines.append(f"# {copies}")
    lines += _sections(plan_config(req, plan))
    return "\n".join(lines) + "\n"


def _copies_note(req: PlanRequest, plan: Plan) -> str | None:
    """What the file's run does not do of the plan's offload (a train run's plan whose copies the run's copy
    lane does not all make, ``run_copies``), or None."""
    if not req.model.blocks:
        return None
    done, possible = run_copies(req, plan)
    if done >= possible:
        return None
    return (f"offload={plan.choice.offload}: the run's copy lane makes {done or 'none'} of the {possible} copies this "
            f"plan counts on (k = {offload_ratio(req, plan):.4g} forwards a copy), so the run keeps more than the "
            f"{memory_text(plan.memory.activations)} of activations planned on the device and uses less than the "
            f"{memory_text(plan.memory.host)} of host memory planned")


def emit(req: PlanRequest, plan: Plan, path: str | Path) -> str:
    """Write the config atomically and return the command that runs it (with a warning where the file
    cannot carry the model, whose run would train the default GPT instead)."""
    write_atomic(path, config_toml(req, plan))
    command = f"pipeoffload train --config {path} --nproc {plan.layout.gpus}"
    partial = _partial_note(plan)
    if partial:
        command += f" (note: {partial})"
    copies = _copies_note(req, plan)
    if copies:
        command += f" (note: {copies})"
    m = req.model
    if not carries_model(m):
        command += (f" (but {m.name}'s shape is not in the file, so that would train the default GPT: plan its "
                    "Hugging Face folder, --model hf:DIR, to write one that trains it)")
    return command
