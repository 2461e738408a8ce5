"""The one place that checks values a user types: the CLI's flags, the playground's query strings and
the service's request dataclasses all go through these functions, so they refuse the same values with
the same words. Each raises ``ValueError`` with "<value> <constraint>"; callers prefix the name."""
from __future__ import annotations

import json
import math
from typing import Any

from pipeoffload.errors import ConfigError


def int_at_least(value: object, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` (text is parsed; a bool or a float is not an integer)."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an integer") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    if value < minimum:
        raise ValueError(f"{value} must be >= {minimum}")
    return value


def finite_at_least(value: object, minimum: float = 0.0) -> float:
    """``value`` as a finite float >= ``minimum``: inf and nan are refused (they make every number after
    them silently wrong), and so is a bool."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number; give one >= {minimum:g}")
    if value < minimum:
        raise ValueError(f"{value} must be >= {minimum:g}")
    return value


def one_of(value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
    return str(value)


def checked(name: str, check: Any, value: object, *args: Any) -> Any:
    """``check(value, *args)`` with a failure turned into ``ConfigError("<name>: <why>")``."""
    try:
        return check(value, *args)
    except ValueError as err:
        raise ConfigError(f"{name}: {err}") from None


def check_model_shape(model: Any) -> None:
    """The sizes a ``planner.ModelSpec`` derives (FFN width, KV heads) are whole and positive: a zero would
    divide by zero deep in the cost formulas, a negative one would give a silently wrong k or plan."""
    for name, value in (("ffn", model.ffn_size), ("kv_heads", model.num_kv_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"model {name}={value!r}: must be an integer >= 1")


def strict_json(data: object, indent: int | None = None) -> str:
    """JSON text that every parser accepts: NaN and infinities are an error here, never ``NaN`` in the
    output (inputs are checked to be finite, so one would be a bug, not bad input)."""
    return json.dumps(data, indent=indent, allow_nan=False)
