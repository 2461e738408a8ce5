"""`pipeoffload generate` at a terminal writes the text as it is generated, and Ctrl-C keeps what came: it
printed nothing until every token was done (`--tokens 65536` ran for ten minutes with nothing shown) and an
interrupt dropped it all (session 20 audit). A pipe still gets the whole text once, as before."""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.hf_fixtures import make_hf_dir  # noqa: E402

PROMPT = "The quick"


def _read_until(fd: int, done: object, deadline: float) -> bytes:
    """What the terminal shows until ``done(shown)`` or the writer closes it (bounded: never hangs)."""
    shown = b""
    while time.monotonic() < deadline and not done(shown):  # type: ignore[operator]
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            shown += chunk
    return shown


def test_at_a_terminal_the_text_comes_as_generated_and_ctrl_c_keeps_it(tmp_path: Path) -> None:
    make_hf_dir(tmp_path, "llama", seed=1, num_hidden_layers=1)
    terminal, their_end = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pipeoffload", "generate", f"hf:{tmp_path}", "--prompt", PROMPT,
                             "--tokens", "65536", "--greedy"], stdin=subprocess.DEVNULL, stdout=their_end,
                            stderr=subprocess.PIPE, text=False)
    os.close(their_end)
    try:
        deadline = time.monotonic() + 180
        shown = _read_until(terminal, lambda b: len(b.decode(errors="replace")) > len(PROMPT) + 10, deadline)
        assert proc.poll() is None, "generation ended before it could be interrupted"  # so the text came live
        assert shown.decode(errors="replace").startswith(PROMPT), shown
        proc.send_signal(signal.SIGINT)
        shown += _read_until(terminal, lambda b: False, deadline)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(terminal)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    found = re.search(r"interrupted after (\d+) of 65536 tokens", err)
    assert found and "Traceback" not in err, err
    from pipeoffload.train.generate import Generation

    generation = Generation(f"hf:{tmp_path}", PROMPT, int(found.group(1)), greedy=True)
    for _ in generation.steps():
        pass
    assert shown.decode().replace("\r\n", "\n") == generation.text() + "\n", (ascii(shown), err)
