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


def _rec(step: int, val: float | None = None) -> dict:
    return {"step": step, "loss": 4.0 + step / 100, "val_loss": val}


@pytest.mark.parametrize("history, step, line", [
    # stopped at step 25 between validations (probe D 8: 'val loss 5.6922' read as the current one)
    ([_rec(1, 5.69221), *(_rec(s) for s in range(2, 26))], 25, "run R: step 25, loss 4.2500, val loss 5.6922 (step 1)"),
    ([_rec(4, 5.8155), _rec(5), _rec(6)], 6, "run R: step 6, loss 4.0600, val loss 5.8155 (step 4)"),
    ([_rec(5), _rec(6, 5.5)], 6, "run R: step 6, loss 4.0600, val loss 5.5000"),  # measured now: no step
    ([_rec(5), _rec(6)], 6, "run R: step 6, loss 4.0600"),  # none measured: left out
    ([_rec(20, 5.0)], 23, "run R: step 23, loss 4.2000 (step 20), val loss 5.0000 (step 20)"),  # --log-every 10
    ([], 6, "run R: step 6"),
])
def test_the_final_summary_says_the_step_of_a_loss_from_an_earlier_step(history, step, line):
    from pipeoffload.train.report import summary_line

    assert summary_line("R", step, history) == line


@pytest.mark.parametrize("record, named", [
    ({"step": "a", "loss": 2.0}, "step is 'a'"),
    ({"step": 1.5, "loss": 2.0}, "step is 1.5"),
    ({"step": 1, "loss": 2.0, "layout": {"pp": "x", "dp": 1, "tp": 1}}, "layout is {'pp': 'x'"),
    ({"step": 1, "loss": 2.0, "layout": [2, 1, 1]}, "layout is [2, 1, 1]"),
])
def test_a_record_with_a_step_or_layout_that_is_not_whole_numbers_is_one_line(tmp_path, capsys, record, named):
    """An edited metrics.jsonl whose step or layout is not whole numbers was a ValueError traceback (int("a")
    in the loss series, int("x") in the layout split); it is refused naming the line, as a resume refuses a bad
    step."""
    run = tmp_path / "run"
    _write_run(run, steps=2)
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"metrics.jsonl:3: {named}" in err and "run report again" in err, err
    assert not (run / "report.html").exists()
