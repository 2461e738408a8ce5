"""A Ctrl-C while the command starts (its imports take 1.1-1.4 s on a loaded machine) ends with the one line
"interrupted" and exit 130, as it does once a command runs, not with a KeyboardInterrupt traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest

# `python -m pipeoffload` (the console script runs the same `from pipeoffload.cli import main; main()`), with a
# real SIGINT delivered when the named module starts to be imported: the signal lands inside that import
_AT_IMPORT = """
import os, runpy, signal, sys

signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (a background job ignores it)

AT = sys.argv[1]


SIGNAL = getattr(signal, sys.argv[2])


class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == AT:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), SIGNAL)
        return None

sys.meta_path.insert(0, Interrupt())
sys.argv = ["pipeoffload", *sys.argv[3:]]
runpy.run_module("pipeoffload", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["numpy", "pipeoffload.planner", "pipeoffload.cli.train"])
def test_ctrl_c_during_the_imports_is_one_line_and_130(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", _AT_IMPORT, module, "SIGINT", "schedules"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "pipeoffload: interrupted\n", done.stderr
    assert done.stdout == ""


def test_sigterm_during_the_imports_says_interrupted_too() -> None:
    """Its default ended the process without a word (train's handler comes after the imports)."""
    done = subprocess.run([sys.executable, "-c", _AT_IMPORT, "pipeoffload.planner", "SIGTERM", "schedules"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 143 and done.stderr == "pipeoffload: interrupted (SIGTERM)\n", done


def test_the_entry_point_imports_nothing_heavy() -> None:
    """What runs before ``main``'s handler: ``pipeoffload`` (with its stdlib-only lazy loader) and
    ``pipeoffload.cli`` alone, no numpy."""
    code = ("import sys; import pipeoffload.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('pipeoffload')), 'numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "['pipeoffload', 'pipeoffload._lazy', 'pipeoffload.cli'] False", \
        done.stdout + done.stderr
