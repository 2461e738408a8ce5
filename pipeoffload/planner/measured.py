"""Save and load measured per-layer costs (``LayerCosts``) as JSON, so ``plan`` can use a profile.

The profiler (``pipeoffload.profiling``, needs torch) writes the file; reading it needs nothing but
the standard library, so the planner stays torch-free.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pipeoffload.errors import ConfigError
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
