"""The one place that checks values a user types: the CLI's flags, the playground's query strings and
the service's request dataclasses all go through these functions, so they refuse the same values with
the same words. Each raises ``ValueError`` with "<value> <constraint>"; callers prefix the name."""
from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from pipeoffload.errors import ConfigError
from pipeoffload.policies import INT_TEXT, NUMBER_TEXT
from pipeoffload.policies import boolean as boolean  # re-exported: moved down for the planner


def plain_hint(text: str, parse: Any) -> str:
    """The fix, for text Python would read as a number but a user means otherwise (``1_0``, ``４``)."""
    try:
        parse(text)
    except ValueError:
        return ""
    return "; write it with the ASCII digits 0-9 only (no '_', spaces or other digits)"


def int_at_least(value: object, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` (text is parsed: ASCII digits with an optional sign only; a bool
    or a float is not an integer)."""
    if isinstance(value, str):
        if not INT_TEXT.fullmatch(value):
            raise ValueError(f"{value!r} is not an integer{plain_hint(value, int)}")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    if value < minimum:
        raise ValueError(f"{value} must be >= {minimum}")
    return value


def finite_at_least(value: object, minimum: float = 0.0) -> float:
    """``value`` as a finite float >= ``minimum``: inf and nan are refused (they make every number after
    them silently wrong), and so is a bool. Text is a plain ASCII decimal or scientific number (``0.5``,
    ``.5``, ``5e-1``)."""
    if isinstance(value, str):
        if not NUMBER_TEXT.fullmatch(value):
            raise ValueError(f"{value!r} is not a number{plain_hint(value, float)}")
        value = float(value)
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
    """``check(value, *args)`` with a failure turned into ``ConfigError("<name>: <why>")`` (an error that
    names its field and flag already, ``ConfigError.named``, as it is)."""
    try:
        return check(value, *args)
    except ConfigError as err:
        if err.flag_message is None:
            raise ConfigError(f"{name}: {err}") from None
        raise
    except ValueError as err:
        raise ConfigError(f"{name}: {err}") from None


def check_finite(data: object, what: str) -> None:
    """Refuse (one line, ``ConfigError``) a result with an infinite or nan number anywhere in ``data`` (its
    ``as_dict()``): hardware or model numbers so extreme that a time overflowed. Checked before anything is
    printed, so ``--json`` never meets one (``strict_json`` would raise) and text never shows "inf s"."""
    bad = _first_non_finite(data, "")
    if bad is not None:
        path, value = bad
        raise ConfigError(f"{what}: {path} came out as {value}: the hardware or model numbers are too extreme "
                          "for finite times; give realistic bandwidths, latencies and sizes")


def _first_non_finite(data: object, path: str) -> tuple[str, float] | None:
    if isinstance(data, float) and not math.isfinite(data):
        return path, data
    if isinstance(data, dict):
        items: Any = data.items()
    elif isinstance(data, (list, tuple)):
        items = enumerate(data)
    else:
        return None
    for key, value in items:
        found = _first_non_finite(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def strict_json(data: object, indent: int | None = None) -> str:
    """JSON text that every parser accepts: NaN and infinities are an error here, never ``NaN`` in the
    output (inputs are checked to be finite, so one would be a bug, not bad input)."""
    return json.dumps(data, indent=indent, allow_nan=False)


# The size guard of ``simulate`` (and the playground): ``schedules.generate`` refuses schedules whose
# actions and per-stage work exceed ``schedules.MAX_ACTIONS``; planning offload multiplies that work. Per
# compute action, the offload pass plans each activation's windows a few times over (pack, greedy,
# the other window order, pruning); where the copy lane cannot hide every copy (k above 1 on one copy
# engine) or a host link is shared, it also plans again for seven slower copy times and simulates
# each plan. Measured (interleaved-1f1b, d=64, v=2, m=256, 2 cores): see OFFLOAD_WORK_* below.
# the lane hides the copies (k <= 1, own host link): about 3x the work without offload, up to 5x where
# plans for faster copies are tried (d=64, k=0.8: 1.29 s of calls against 0.29 s without offload)
OFFLOAD_WORK_HIDDEN = 5
OFFLOAD_WORK_OVERLOADED = 40  # an overloaded lane or a shared host link: the slower-copy plans too


def offload_work_factor(offload: str, k: float | None, shared_host_link: bool, max_stall: float = 0.0) -> int:
    """How many times the work of generating and simulating a schedule its offload planning adds up to
    (1 without offload); ``k`` None means copy times from a costs file (assumed overloaded). A stall
    budget (``max_stall`` > 0) plans again for six faster copy times, as many as an overloaded lane."""
    if offload.strip() in ("", "none"):
        return 1
    if shared_host_link or k is None or k > 1.0 or max_stall > 0:
        return OFFLOAD_WORK_OVERLOADED
    return OFFLOAD_WORK_HIDDEN


READABLE_BELOW = 10**9  # counts from here on are written as "2.0e28": 29 digits, even with commas, do not read


def readable_count(n: int) -> str:
    """``n`` with thousands separators, or in two significant digits ("2.0e28") from ``READABLE_BELOW`` on
    (a huge rank count's exact work is neither readable nor meaningful in an estimate)."""
    if n < READABLE_BELOW:
        return f"{n:,}"
    mantissa, exponent = f"{Decimal(n):.1e}".split("e")  # Decimal: exact for ints past float's range
    return f"{mantissa}e{int(exponent)}"


def check_work(actions: int, factor: int, limit: int, what: str) -> None:
    """Refuse, before any work, a request whose ``actions`` of work times ``factor`` exceed ``limit``: one
    line naming the sizes (``what``), the estimate, the limit and the fix."""
    work = actions * factor
    if work > limit:
        planning = f" (x{factor} for planning offload)" if factor > 1 else ""
        smaller_k = ", or a smaller offload ratio k (copies the lane can hide are planned once)" if factor > 1 else ""
        raise ConfigError.named(lambda n: f"{what}: about {readable_count(work)} actions of work{planning}, above the limit of "
                                f"{limit:,}; use fewer ranks{' (-d)' if n.flags else ''} or microbatches"
                                f"{' (-m)' if n.flags else ''}{smaller_k}")
