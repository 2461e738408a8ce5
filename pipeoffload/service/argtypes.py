"""argparse pieces built on ``service.checks``, for every command-line front end (``pipeoffload``'s
subcommands, ``python -m pipeoffload.runtime``): a flag refuses what a request refuses, in the same words."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from pipeoffload.service.checks import finite_at_least, int_at_least


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line and exit 2 (argparse would print the usage too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


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
