"""What README.md and docs/*.md quote is what the commands print now: the output lines under each
``$ pipeoffload ...`` of a console block, the rows the planner guide cites from a ``plan`` output,
and ``--help`` texts free of the docstrings' reST markup."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(path: Path) -> list[list[str]]:
    """The lines of each fenced block of ``path`` (any language)."""
    blocks: list[list[str]] = []
    inside = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
            if inside:
                blocks.append([])
        elif inside and blocks[-1] and blocks[-1][-1].endswith("\\"):  # a command continued
            blocks[-1][-1] = blocks[-1][-1][:-1] + line.lstrip()
        elif inside:
            blocks[-1].append(line)
    return blocks


def _quoted_outputs() -> list[tuple[str, str, list[str]]]:
    """(file, command, quoted lines) for every ``$ pipeoffload`` command followed by output lines; a
    quoted ``...`` stands for lines left out, an indented ``# ...`` continues the command's comment."""
    found = []
    for path in DOCS:
        for block in _blocks(path):
            for i, line in enumerate(block):
                if not line.startswith("$ pipeoffload "):
                    continue
                quoted = []
                for out in block[i + 1:]:
                    if out.startswith("$ "):
                        break
                    if out.strip() not in ("...", "…") and not (out.startswith(" ") and out.lstrip().startswith("#")):
                        quoted.append(out)
                if quoted:
                    found.append((path.name, line[2:].split("  #")[0].strip(), quoted))
    return found


QUOTED = _quoted_outputs()


def test_the_docs_quote_outputs() -> None:  # the check below must have something to check
    assert {name for name, _, _ in QUOTED} >= {"README.md", "planner.md", "offload.md"}, QUOTED


@pytest.mark.parametrize("name, command, quoted", QUOTED, ids=[f"{n}: {c}" for n, c, _ in QUOTED])
def test_a_quoted_output_is_what_the_command_prints(name: str, command: str, quoted: list[str]) -> None:
    code, out, err = run_cli(*shlex.split(command)[1:])
    assert code == 0, err
    printed = [line.rstrip() for line in out.splitlines()]
    missing = [line for line in quoted if line.rstrip() not in printed]
    assert not missing, f"{name}: `{command}` no longer prints {missing}"


def test_the_planner_guide_cites_the_rows_of_its_stall_budget_example() -> None:
    """Section 4b names rows of section 4's ``--max-stall 5`` example by number; the escalation that
    added a budget + recompute auto plan moved them (row 3 became 4, row 1 became 2)."""
    text = " ".join((ROOT / "docs" / "planner.md").read_text().split())
    command = "plan --model llama3-8b --gpu h100 --gpus 8 --global-batch 64 --memory 44 --tp 1 --schedules zb-v,zb-h1 --max-stall 5"
    assert f"(`{command}`)" in text
    code, out, err = run_cli(*command.split())
    assert code == 0, err
    best = out[out.index("best plans that fit"):].split("\n\n")[0]  # not the Pareto table below it
    rows = {int(m.group(1)): m.group(0) for m in re.finditer(r"^\s+(\d+)\s+PP\S+.*$", best, re.M)}
    cited = re.findall(r"row (\d) of the `--max-stall 5` example of section 4 \(([^,]+), offload `([^`]+)`, "
                       r"([\d,]+) tokens/s.*?its row (\d) \(([^,]+), recompute `([^`]+)`, ([\d,]+) tokens/s", text)
    assert len(cited) == 1, "section 4b no longer cites the example's rows in the words this test reads"
    first, layout, offload, tokens, second, layout2, recompute, tokens2 = cited[0]
    for row, words in ((first, [*layout.split(), offload, tokens]), (second, [*layout2.split(), recompute, tokens2])):
        assert all(w in rows[int(row)].split() for w in words), (row, words, rows[int(row)])


def _help_texts() -> dict[str, str]:
    """Every ``--help`` a user can print: the command, each subcommand, the runtime and the demo."""
    from pipeoffload.cli import build_parser
    from pipeoffload.demo import main as demo_main
    from pipeoffload.runtime.demo import parse as runtime_parse

    parser = build_parser()
    texts = {"pipeoffload": parser.format_help()}
    sub = next(a for a in parser._actions if a.dest == "command")
    texts.update({f"pipeoffload {name}": p.format_help() for name, p in sub.choices.items()})  # type: ignore[union-attr]
    for name, show in (("python -m pipeoffload.demo", demo_main), ("python -m pipeoffload.runtime", runtime_parse)):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            show(["--help"])
        texts[name] = out.getvalue()
    return texts


def test_no_help_text_shows_rest_markup() -> None:
    """The descriptions are docstrings' first lines; ``pipeoffload --help`` printed
    "The ``pipeoffload`` command: ..." (also compare's and the demo's)."""
    marked = {name: next(line for line in text.splitlines() if "``" in line)
              for name, text in _help_texts().items() if "``" in text}
    assert not marked, marked


def test_every_commands_help_says_what_it_does() -> None:
    """``pipeoffload plan --help`` (and 9 more) began with the usage and went on to the options, never
    saying what the command does; each now opens with its line of ``pipeoffload --help``."""
    from pipeoffload.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, command in sub.choices.items():  # type: ignore[union-attr]
        said = " ".join((command.description or "").split())
        assert said and said[:40] in " ".join(command.format_help().split()), name
    listed = {a.dest: a.help for a in sub._choices_actions}  # type: ignore[attr-defined]
    assert sub.choices["plan"].description == listed["plan"]  # type: ignore[index]


def test_simulates_cost_flags_state_their_defaults() -> None:
    """--p2p-time's help said "point-to-point transfer time" and not that it is 0 unless given."""
    from pipeoffload.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    simulate = sub.choices["simulate"]  # type: ignore[index]
    for action in simulate._actions:
        if action.dest in ("time_f", "time_i", "time_w", "p2p_time"):
            assert "(default " in (action.help or ""), action.option_strings  # None here: given or not
