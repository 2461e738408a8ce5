import os

# One thread for torch's (OpenMP) and numpy's (OpenBLAS) operators in every test process and the processes
# it starts (set before either is imported): the suite runs two xdist workers and their spawned ranks on a
# 2-core machine, and with a thread per core each parallel operator waits at a barrier for a thread that
# another process has descheduled (a 32x32 matmul took milliseconds; benchmarks/gpu_check.py's tiny CPU run,
# 1.8 s alone, took 3.4 s beside one busy process and 50 s on a loaded machine). The ranks use one thread
# already (``spawn(threads=1)``). A value set outside the suite is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import contextlib
import io
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeoffload.cli import main
from pipeoffload.costs import CostModel


@pytest.fixture
def unit_costs() -> CostModel:
    """F = I = W = 1 per stage, zero communication: the costs the paper's formulas assume."""
    return CostModel.uniform(1.0, 1.0, 1.0)


GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> "list[object]":
    """The requests --plan auto gives the planner."""
    import pipeoffload.planner as planner

    seen: list[object] = []
    real = planner.find_plans

    def spy(req: object) -> object:
        seen.append(req)
        return real(req)

    monkeypatch.setattr(planner, "find_plans", spy)
    return seen


def check_golden(filename: str, text: str) -> None:
    """Compare ``text`` with ``tests/golden/<filename>``; a test never rewrites it.

    After an intended change, regenerate with ``python -m tests.regen_golden`` and review the diff.
    """
    path = GOLDEN / filename
    assert path.exists(), f"{path} is missing: run python -m tests.regen_golden"
    assert path.read_text() == text, f"{filename} differs; if intended, run python -m tests.regen_golden"


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``pipeoffload ARGV`` in this process: (exit code, stdout, stderr); argparse's own errors exit."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def refused(command: str, *pieces: str) -> str:
    """The one-line error (exit 2, nothing on stdout, no traceback) of ``pipeoffload COMMAND``, which
    holds every one of ``pieces``."""
    code, out, err = run_cli(*shlex.split(command))
    assert code == 2 and out == "" and len(err.splitlines()) == 1, (code, out, err)
    assert "Traceback" not in err
    for piece in pieces:
        assert piece in err, err
    return err


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    """A playground server on a free port of this machine, for one test module: its base URL."""
    from pipeoffload.web.server import make_server

    server = make_server(0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def one_rank() -> Iterator[None]:
    """A gloo process group of one rank in this process (torch imported only by the tests that ask)."""
    import datetime
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        try:
            yield
        finally:
            dist.destroy_process_group()


def train_process(*argv: str) -> "subprocess.CompletedProcess[str]":
    """``pipeoffload train ARGV`` in a process of its own (its ranks are real processes)."""
    return subprocess.run([sys.executable, "-m", "pipeoffload", "train", *argv], capture_output=True, text=True,
                          timeout=300)


def one_line_error(done: "subprocess.CompletedProcess[str]") -> str:
    """The one-line refusal (exit 2, no traceback) of a finished process."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]
