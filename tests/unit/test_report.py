"""``pipeoffload report RUN_DIR``: the picture and the self-contained page from a metrics.jsonl."""
from __future__ import annotations

import base64
import json
import re

import pytest

from pipeoffload.cli import main


def _write_run(folder, steps: int = 12, ranks: int = 2) -> None:
    folder.mkdir(exist_ok=True)
    lines = []
    for step in range(1, steps + 1):
        lines.append({
            "step": step, "loss": 4.0 / step ** 0.5, "val_loss": 3.9 / step ** 0.5 if step % 4 == 0 else None,
            "lr": 3e-4, "grad_norm": 1.0, "tokens_per_s": 1000.0 + step, "step_s": 0.5,
            "peak_act_bytes": [3 * 2**20 - r * 2**20 for r in range(ranks)],
            "sim_peak_act_bytes": [3 * 2**20 - r * 1.4 * 2**20 for r in range(ranks)],
            "host_bytes": [2**20] * ranks, "reload_stall_s": [0.001] * ranks, "cuda_max_allocated": None,
        })
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "config.toml").write_text('schedule = "group-interleaved"\npp = 2\nsteps = 12\nlr = 3e-4\n')


def test_report_writes_png_and_self_contained_html(tmp_path, capsys):
    run = tmp_path / "run"
    _write_run(run)
    assert main(["report", str(run)]) == 0
    png, page = run / "report.png", run / "report.html"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    text = page.read_text()
    embedded = re.search(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert embedded and base64.b64decode(embedded.group(1)) == png.read_bytes()
    assert "http" not in text.replace("data:image", "")  # nothing fetched from elsewhere
    assert "group-interleaved" in text and "12" in text
    assert "first / last train loss" in text and f"{4.0:.4f} / {4.0 / 12 ** 0.5:.4f}" in text
    assert f"{3.9 / 12 ** 0.5:.4f} (step 12)" in text  # last validation loss
    assert "3.00 MiB (simulated 3.00 MiB, measured/simulated 1.000)" in text
    assert "2.00 MiB (simulated 1.60 MiB, measured/simulated 1.250)" in text
    assert "1,007" in text  # median tokens/s over steps 2..12
    assert str(run / "report.html") in capsys.readouterr().out


@pytest.mark.parametrize("make", ["missing_dir", "no_metrics", "empty", "corrupt"])
def test_bad_run_dir_one_line_exit_2(tmp_path, capsys, make):
    run = tmp_path / "run"
    if make != "missing_dir":
        run.mkdir()
    if make == "empty":
        (run / "metrics.jsonl").write_text("\n")
    if make == "corrupt":
        (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss"\n')
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeoffload report: error: ") and len(err.strip().splitlines()) == 1, err
    assert not (run / "report.html").exists()


def test_report_reads_a_config_with_sections(tmp_path):
    run = tmp_path / "run"
    _write_run(run)
    (run / "config.toml").write_text('[schedule]\nfamily = "zb-v"\n\n[parallel]\npp = 2\n')
    assert main(["report", str(run)]) == 0
    text = (run / "report.html").read_text()
    assert "(zb-v)" in text and "parallel.pp" in text and "{" not in text.split("<h2>Config</h2>")[1][:400]
