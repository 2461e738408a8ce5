"""Every option of every command says what it does and, where it has a value by default, that value.

``pipeoffload k/plan/estimate --help`` listed ``--layers N --hidden N --heads N --kv-heads N --ffn N --seq N
--vocab N --microbatch-size N`` without a word, and ``python -m pipeoffload.runtime --help`` seven of its
thirteen flags; others had a default the help did not show (``estimate --offload``, ``plan --stages-per-rank``).
The defaults are read from the parsers themselves, so a help that names another value than the one argparse
applies fails too."""
from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from pipeoffload.cli import build_parser

# shape flags whose default is the preset's (or a rule), not one value argparse holds: each must say it anyway
SHAPE_FLAGS = ("--layers", "--hidden", "--heads", "--kv-heads", "--ffn", "--seq", "--vocab", "--microbatch-size",
               "--head-dim")


def _commands(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``parser`` and every subcommand under it (``trace compare`` too), by their command line."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from _commands(child, f"{name} {sub}")


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from pipeoffload.demo import build_parser as demo_parser

    parsers = [*_commands(build_parser(), "pipeoffload"), ("python -m pipeoffload.demo", demo_parser())]
    try:
        from pipeoffload.runtime.demo import build_parser as runtime_parser
    except ModuleNotFoundError:  # torch is not installed: the runtime has no parser to print
        return parsers
    return [*parsers, ("python -m pipeoffload.runtime", runtime_parser())]


def _options(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action, str]]:
    """Each argument of ``parser`` (not --help, --version or the subcommand list) with its help as printed."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        help_text = formatter._expand_help(action) if action.help else ""
        yield "/".join(action.option_strings) or action.dest, action, " ".join(help_text.split())


def _shown(default: object) -> str | None:
    """How a help writes ``default``; None for "nothing" (absent, off, empty), which needs no mention."""
    if default in (None, False, "", [], (), argparse.SUPPRESS):
        return None
    if default is True:
        return "on"
    if isinstance(default, float):
        return f"{default:g}"
    if isinstance(default, tuple):
        return ",".join(map(str, default))
    return str(default)


def test_every_option_has_help() -> None:
    missing = [f"{name}: {flag}" for name, parser in _all_parsers() for flag, _, text in _options(parser) if not text]
    assert not missing, missing


def test_every_default_is_stated_as_the_parser_applies_it() -> None:
    unstated = []
    for name, parser in _all_parsers():
        for flag, action, text in _options(parser):
            shown = _shown(action.default)
            if shown is not None and not ("default" in text and shown in text):
                unstated.append(f"{name}: {flag} (default {shown}): {text!r}")
    assert not unstated, unstated


@pytest.mark.parametrize("command", ["k", "plan", "estimate"])
def test_model_shape_flags_state_unit_and_default(command: str) -> None:
    parsers = dict(_all_parsers())
    options = {flag: text for flag, _, text in _options(parsers[f"pipeoffload {command}"])}
    for flag in SHAPE_FLAGS:
        assert "default" in options[flag], (command, flag, options[flag])


def test_shape_defaults_come_from_the_model_spec() -> None:
    """--vocab and --microbatch-size show ModelSpec's own defaults, the values a shape without them gets."""
    from dataclasses import fields

    from pipeoffload.planner.model import ModelSpec

    spec_default = {f.name: f.default for f in fields(ModelSpec)}
    options = {flag: text for flag, _, text in _options(dict(_all_parsers())["pipeoffload plan"])}
    assert f"else {spec_default['vocab']}" in options["--vocab"]
    assert f"else {spec_default['microbatch']}" in options["--microbatch-size"]
