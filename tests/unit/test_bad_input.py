"""Bad input, subcommand by subcommand: exit 2, one line naming the value, nothing on stdout, nothing
written. Each row is (command line, a piece of the message); grow the table with every flag."""
from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path

import pytest

import pipeoffload.cli.simulate as simulate_cli
from pipeoffload.cli import main

PLAN = "plan --model llama3-8b --gpus 8 --global-batch 64"
EST = "estimate --layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 50257 --global-batch 32"
CASES = [
    ("simulate 1f1b --time-f inf", "--time-f: inf is not a finite number"),
    ("simulate 1f1b --p2p-time nan", "--p2p-time: nan is not a finite number"),
    ("simulate 1f1b --offload all --offload-ratio inf", "--offload-ratio: inf is not a finite number"),
    ("simulate 1f1b --time-f 1e308", "step time overflows"),
    ("simulate 1f1b --time-f 0 --time-i 0 --time-w 0", "at least one compute time must be positive"),
    ("simulate 1f1b --ranks 0", "0 must be >= 1"),
    ("simulate 1f1b --offload budget:1e999rank --json", "inf must be a finite number >= 0"),
    ("simulate 1f1b --offload budget:inf", "inf must be a finite number >= 0"),
    ("simulate 1f1b --costs nan.json", "p2p_time=nan: must be a finite number"),
    ("simulate 1f1b --costs zero.json", "every compute time"),
    ("simulate 1f1b --costs five.json", "costs = 5: expected a table"),
    ("simulate 1f1b --costs contended.json", "concurrency_slowdown is not applied by simulate"),
    ("simulate 1f1b --plot out.png --trace afolder", "--trace afolder: is a folder"),
    ("simulate 1f1b --report nofolder/r.html", "folder nofolder does not exist"),
    ("simulate 1f1b --plot out.gif", "unknown picture format 'gif'"),
    ("compare 1f1b -o afolder", "-o afolder: is a folder"),
    ("compare 1f1b '1f1b --time-f nan'", "'1f1b --time-f nan': argument --time-f: nan is not a finite number"),
    ("compare 1f1b --plots nan.json", "--plots nan.json: is a file, not a folder"),
    ("compare 1f1b 'nope' --plots new/folder", "'nope': unknown schedule 'nope'"),
    ("k --model llama3-8b --ffn 0", "--ffn: 0 must be >= 1"),
    ("k --model llama3-8b --kv-heads 0", "--kv-heads: 0 must be >= 1"),
    ("k --model llama3-8b --hw memory_gib=abc", "--hw memory_gib=abc: not a number"),
    ("k --model llama3-8b --hw d2h_gbps=inf", "--hw d2h_gbps=inf: not a finite number"),
    ("k --model llama3-8b --offload-bw inf", "--offload-bw inf: not a finite number"),
    ("k --model llama3-8b --tp 0", "tp: 0 must be >= 1"),
    (f"{PLAN} --emit afolder", "--emit afolder: is a folder"),
    (f"{PLAN} --ffn 0", "--ffn: 0 must be >= 1"),
    (f"{PLAN} --host-memory inf", "--host-memory inf: not a finite number"),
    (f"{PLAN} --memory nan", "--memory nan"),
    # an uneven even split is costed as plan splits it; fewer layers than stages is refused
    (f"{EST} --pp 25", "--layers 24 cannot give each of pp x stages-per-rank = 25 x 1 stages a layer (--split "
                       "even); use fewer stages or --split balanced"),
    (f"{EST} --pp 4 --schedule interleaved-1f1b --stages-per-rank 8", "--layers 24 cannot give each of pp x "
                                                                      "stages-per-rank = 4 x 8 stages a layer"),
    (f"{EST} --tp 3", "--tp 3 must divide the heads (16)"),
    (f"{EST} --gpu b300", "unknown gpu 'b300'"),
    (f"{EST} --dp 4 --microbatch-size 3", "--global-batch 32 is not divisible by dp x microbatch size = 4 x 3"),
    (f"{EST} --memory inf", "--memory inf: not a finite number"),
    (f"{EST} --memory nan", "--memory nan: not a finite number"),
    (f"{EST} --hw d2h_gbps=inf", "--hw d2h_gbps=inf: not a finite number"),
    (f"{EST} --flops nan", "not a finite number"),
    ("playground --port 70000", "70000 is not a TCP port"),
    ("trace compare afolder", "RUN_TRACE afolder: cannot read it"),
    ("trace compare missing.json", "RUN_TRACE missing.json: no such file"),
    ("trace compare five.json", "not a Chrome trace: expected an object with a 'traceEvents' list"),
    ("trace", "give an action: compare"),
    ("export missing --hf out", "RUN_DIR 'missing' does not exist"),
    ("generate missing", "RUN_DIR 'missing' does not exist"),
    ("train --out nan.json", "out='nan.json': exists and is not a folder"),
    ("report afolder", "'afolder/metrics.jsonl' does not exist"),
    ("show 1f1b --ranks 999999 -m 1", "above the limit"),
    ("generate x --temperature nan", "--temperature: nan is not a finite number"),
    ("generate x --temperature -1", "--temperature: -1.0 must be >= 0"),
    ("generate x --seed 1e30", "--seed: '1e30' is not an integer"),
    ("generate x --seed 100000000000000000000000000000", "above 9223372036854775807"),
    ("generate x --tokens 1e9", "--tokens: '1e9' is not an integer"),
    ("generate x --tokens 1000000000", "more than 65,536 tokens"),
    ("generate x --prompt '\udcff\udcfe'", "--prompt: is not valid UTF-8 (byte 0xff at character 0)"),
]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "afolder").mkdir()
    (tmp_path / "nan.json").write_text('{"time_f": 1, "time_b": 2, "p2p_time": NaN}')
    (tmp_path / "zero.json").write_text('{"time_f": 0, "time_b": 0, "time_w": 0}')
    (tmp_path / "five.json").write_text('{"costs": 5}')
    (tmp_path / "contended.json").write_text('{"time_f": 1, "concurrency_slowdown": [1.0, 1.5]}')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(command: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(shlex.split(command))
        except SystemExit as exit_:  # argparse's own errors exit
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


@pytest.mark.parametrize("command,message", CASES, ids=[c for c, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_written(workdir: Path, command: str, message: str) -> None:
    before = _files(workdir)
    code, out, err = _run(command)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and message in err, err
    assert err.startswith(f"pipeoffload {command.split()[0]}: error: ")
    assert _files(workdir) == before


def test_ctrl_c_is_exit_130_in_one_line(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(simulate_cli, "simulate", interrupted)
    code, out, err = _run("simulate 1f1b --plot out.png")
    assert (code, out, err) == (130, "", "pipeoffload simulate: interrupted\n")
    assert not (workdir / "out.png").exists()


def test_ctrl_c_stops_the_playground_with_exit_130(tmp_path: Path) -> None:
    """A real SIGINT to a serving playground (port 0: any free port): exit 130, one line, no traceback."""
    import signal
    import subprocess
    import sys

    def as_a_terminal_starts_it() -> None:
        # SIGINT at its default and unblocked in the child, whatever this test worker's own state: an
        # ignored or blocked SIGINT is inherited across exec, and the child would never see the Ctrl-C
        # (a clean-clone CI run once timed out here after other tests had run in the same worker)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    proc = subprocess.Popen([sys.executable, "-m", "pipeoffload", "playground", "--port", "0"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_a_terminal_starts_it)
    try:
        assert proc.stdout is not None and "playground on http://127.0.0.1:" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err == "pipeoffload playground: interrupted\n", err


def test_a_wrong_run_dir_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    """export and generate check RUN_DIR first: importing torch takes seconds, a typo must answer at once."""
    import subprocess
    import sys

    code = ("import sys; from pipeoffload.cli import main; "
            "codes = [main(['export', 'missing', '--hf', 'out']), main(['generate', 'missing'])]; "
            "print(codes, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[2, 2] False", done.stdout + done.stderr
    assert done.stderr.count("does not exist") == 2 and list(tmp_path.iterdir()) == []
