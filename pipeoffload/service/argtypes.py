"""argparse pieces built on ``service.checks``, for every command-line front end (``pipeoffload``'s
subcommands, ``python -m pipeoffload.runtime``): a flag refuses what a request refuses, in the same words."""
from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any, NoReturn

from pipeoffload.policies import INT_TEXT, NUMBER_TEXT
from pipeoffload.service.checks import finite_at_least, int_at_least, plain_hint

_SEEN = "_options_given"  # the namespace's record of the single-valued options given, while it is parsed


class _StoreOnce(argparse._StoreAction):
    """argparse's ``store``, but an option given twice (``-d 8 -d 2``) is an error, never silently the last
    value: the playground refuses a repeated parameter the same way. Options meant to repeat use
    ``action="append"`` (e.g. ``--hw``), which this does not touch."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.option_strings:  # a positional is consumed once anyway
            seen = namespace.__dict__.setdefault(_SEEN, {})
            given = f"{option_string} {_shown(values)}"
            if self.dest in seen:
                raise argparse.ArgumentError(self, f"given twice ({seen[self.dest]}, then {given}); give it once")
            seen[self.dest] = given
        super().__call__(parser, namespace, values, option_string)


def _shown(values: Any) -> str:
    """A parsed value as it was typed: a list of words word by word, a tuple of a comma list (``--pp
    8,4``) with its commas."""
    items = values if isinstance(values, list) else [values]
    return " ".join(shlex.quote(",".join(map(str, item)) if isinstance(item, tuple) else str(item)) for item in items)


def _plain_int(text: str) -> int:
    """``type=int`` of every OneLineParser: ``int()`` reads ``1_0`` as 10 and ``４`` as 4, a typo as
    another value; only plain ASCII digits (``service.checks.INT_TEXT``), any sign or size."""
    if not INT_TEXT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer{plain_hint(text, int)}")
    return int(text)


def _plain_float(text: str) -> float:
    """``type=float`` of every OneLineParser: a plain ASCII decimal or scientific number
    (``service.checks.NUMBER_TEXT``); inf and nan are refused after parsing (``cli.refuse_non_finite``)."""
    if not NUMBER_TEXT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number{plain_hint(text, float)}")
    return float(text)


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line and exit 2 (argparse would print the usage too); a
    single-valued option given twice is one of them, and so is an unknown argument, reported by the
    subcommand that was parsing (``pipeoffload show: error: ...``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "store", _StoreOnce)
        self.register("action", None, _StoreOnce)
        self.register("type", int, _plain_int)  # every type=int/float flag: plain ASCII number text
        self.register("type", float, _plain_float)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:  # type: ignore[override]
        parsed, extras = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(_SEEN, None)
        return parsed, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._innermost(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _innermost(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The (sub)command parser that ``parsed`` ended in: the one to name in an error."""
        parser: argparse.ArgumentParser = self
        while True:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            chosen = getattr(parsed, subs[0].dest, None) if subs and subs[0].dest != argparse.SUPPRESS else None
            if chosen not in (subs[0].choices if subs else {}):
                return parser
            parser = subs[0].choices[chosen]


def flag_type(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` from a ``service.checks`` function: its message after argparse's flag name."""
    def convert(text: str) -> Any:
        try:
            return check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    convert.__name__ = check.__name__
    return convert


positive_int = flag_type(int_at_least)
non_negative_float = flag_type(finite_at_least)


def default_of(request: type, name: str) -> Any:
    """The default of field ``name`` of the request dataclass ``request``: a flag that sets that field takes
    it from there (and shows it with ``%(default)s``), so the flag, its help and the Python API cannot
    disagree."""
    from dataclasses import MISSING, fields

    field = next(f for f in fields(request) if f.name == name)
    if field.default is MISSING:
        raise TypeError(f"{request.__name__}.{name} has no default")
    return field.default
