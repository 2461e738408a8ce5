"""Save and load measured per-layer costs (``LayerCosts``) as JSON, so ``plan`` can use a profile.

The profiler (``pipeoffload.profiling``, needs torch) writes the file; reading it needs nothing but
the standard library, so the planner stays torch-free.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from pipeoffload.errors import ConfigError
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.stagecosts import LayerCosts

FORMAT = "pipeoffload-layer-costs/1"


def layer_costs_to_dict(lc: LayerCosts) -> dict:
    out = dataclasses.asdict(lc)
    out["head_time"] = list(lc.head_time)
    out["embedding_time"] = list(lc.embedding_time)
    return {"format": FORMAT, **out}


def layer_costs_from_dict(data: dict) -> LayerCosts:
    if data.get("format") != FORMAT:
        raise ConfigError(f"layer-cost file format {data.get('format')!r}: expected {FORMAT!r} "
                          "(write it with pipeoffload.profiling)")
    fields = {f.name for f in dataclasses.fields(LayerCosts)}
    values = {k: v for k, v in data.items() if k in fields}
    if "head_time" in values:
        values["head_time"] = tuple(float(x) for x in values["head_time"])
    if "embedding_time" in values:
        values["embedding_time"] = tuple(float(x) for x in values["embedding_time"])
    try:
        return LayerCosts(**values)
    except TypeError as err:
        raise ConfigError(f"layer-cost file: {err}") from None


def save_layer_costs(lc: LayerCosts, path: str | Path) -> None:
    Path(path).write_text(json.dumps(layer_costs_to_dict(lc), indent=1) + "\n")


def load_layer_costs(path: str | Path) -> LayerCosts:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"layer-cost file {str(path)!r}: {err}") from None
    return layer_costs_from_dict(data)


def check_profile(lc: LayerCosts, model: ModelSpec) -> None:
    """Refuse costs measured on another layer or another microbatch shape than ``model``'s. The file records
    no model name: one layer's parameters (per TP rank) and the hidden states it passes on (tokens x hidden
    per microbatch, in bf16/fp16 or fp32, the rank's sequence shard or all of it) are what identify it.
    The layer count and vocabulary are the plan's; ``model_flops`` (MFU) is used as recorded."""
    tp = lc.tp
    params = model.params_per_layer() / tp
    elements = model.tokens * model.hidden
    sent = [elements * size / shard for size in (2, 4) for shard in {1, tp}]
    if math.isclose(lc.params, params, rel_tol=1e-6) and any(math.isclose(lc.boundary_bytes, x, rel_tol=1e-6)
                                                             for x in sent):
        return
    raise ConfigError.named(lambda n: (
        f"{n('measured') if n.flags else 'measured (the LayerCosts)'} was measured on a layer of {lc.params:,.0f} parameters passing {lc.boundary_bytes:,.0f} "
        f"bytes per microbatch at TP {tp}, but {model.name} at seq {model.seq}, microbatch {model.microbatch} has "
        f"{params:,.0f} parameters per layer and {elements * 2 / tp:,.0f} bytes (bf16); re-profile this model at "
        f"this {n('model.seq')} and {n('model.microbatch')} (pipeoffload.profiling.measure_layer_costs), or "
        f"{'drop --profile' if n.flags else 'leave measured None'}"))
