"""Save and load measured per-layer costs (``LayerCosts``) as JSON, so ``plan`` can use a profile.

The profiler (``pipeoffload.profiling``, needs torch) writes the file; reading it needs nothing but
the standard library, so the planner stays torch-free.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.fileio import read_input_text
from pipeoffload.planner.model import ModelSpec
from pipeoffload.planner.stagecosts import LayerCosts

FORMAT = "pipeoffload-layer-costs/1"


def layer_costs_to_dict(lc: LayerCosts) -> dict:
    out = dataclasses.asdict(lc)
    out["head_time"] = list(lc.head_time)
    out["embedding_time"] = list(lc.embedding_time)
    return {"format": FORMAT, **out}


def layer_costs_from_dict(data: object, where: str = "layer-cost file") -> LayerCosts:
    """``LayerCosts`` from a layer-cost file's JSON; a value of the wrong type is one ``ConfigError`` naming
    ``where`` and the field (a hand-edited or truncated file would otherwise fail deep in the planner)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: not a JSON object of LayerCosts fields (write it with pipeoffload.profiling)")
    if data.get("format") != FORMAT:
        raise ConfigError(f"{where}: format {data.get('format')!r}: expected {FORMAT!r} "
                          "(write it with pipeoffload.profiling)")
    fields = {f.name: f for f in dataclasses.fields(LayerCosts)}
    missing = [name for name, f in fields.items()
               if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)} (write it with pipeoffload.profiling)")
    values: dict[str, Any] = {name: _field_value(name, data[name], where) for name in fields if name in data}
    return LayerCosts(**values)


_LENGTHS = {"head_time": 3, "embedding_time": 2}  # the tuple fields: (F, I, W) and (F, B)
_OPTIONAL = {"w_bytes", "head_w_bytes", "time_b", "head_time_b"}  # None: derived from the others


def _field_value(name: str, value: object, where: str) -> object:
    """One field of a layer-cost file, checked: seconds, bytes and counts are finite numbers >= 0."""
    if name == "source":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: source={value!r}: not text")
        return value
    if name == "tp":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: tp={value!r}: must be a whole number >= 1 (the TP size it was measured at)")
        return value
    if value is None and name in _OPTIONAL:
        return None
    if name in _LENGTHS:
        if not isinstance(value, list) or len(value) != _LENGTHS[name] or not all(map(_is_number, value)):
            raise ConfigError(f"{where}: {name}={value!r}: must be a list of {_LENGTHS[name]} finite numbers >= 0")
        return tuple(float(x) for x in value)
    return _number(name, value, where)


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def _number(name: str, value: object, where: str) -> float:
    if not _is_number(value):
        raise ConfigError(f"{where}: {name}={value!r}: must be a finite number >= 0")
    return float(value)  # type: ignore[arg-type]


def save_layer_costs(lc: LayerCosts, path: str | Path) -> None:
    Path(path).write_text(json.dumps(layer_costs_to_dict(lc), indent=1) + "\n")


def load_layer_costs(path: str | Path) -> LayerCosts:
    try:
        data = json.loads(read_input_text(path))
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError, and UnicodeDecodeError (not text)
        raise ConfigError(f"layer-cost file {str(path)!r}: {err}") from None
    return layer_costs_from_dict(data, f"layer-cost file {str(path)!r}")


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
