"""`pipeoffload compare`: one page, unambiguous labels, the exact command of each row, the JSON numbers."""
import json
import re
from pathlib import Path

from pipeoffload.cli import main
from pipeoffload.cli.outputs import file_slug

SPECS = ["1f1b -d 4 -m 8", "group-interleaved -d 4 -m 8 -g 2", "group-interleaved -d 4 -m 8 -g 2 --offload all"]


def test_compare_page_labels_commands_and_numbers(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    page, plots = tmp_path / "c.html", tmp_path / "plots" / "new"  # a missing folder is created
    assert main(["compare", *SPECS, "--with", "--offload-ratio 0.5", "-o", str(page), "--plots", str(plots),
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    labels = [r["label"] for r in rows]
    assert len(set(labels)) == 3 and not any("d=4" in label or "offload-ratio" in label for label in labels)
    assert labels == ["1f1b v=1", "group-interleaved v=2 · group-size 2", "group-interleaved v=2 · group-size 2 · offload all"]
    for spec, row in zip(SPECS, rows):  # each command reproduces its row's numbers exactly
        assert row["command"].startswith("pipeoffload simulate " + spec.split()[0])
        assert main([*row["command"].split()[1:], "--json"]) == 0
        alone = json.loads(capsys.readouterr().out)
        assert alone == {k: v for k, v in row.items() if k not in ("label", "command")}
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 3 and "http" not in text and "<script" not in text
    for label in labels:
        assert label in text
    assert "every row: d=4 m=8 · offload-ratio 0.5" in text
    cells = re.findall(r"<tr data-row='(\d)'>", text)
    assert cells == ["1", "2", "3"] and "makespan (t)" in text and "device peak (rank units)" in text
    assert sorted(p.name for p in plots.iterdir()) == sorted(f"{file_slug(label)}.png" for label in labels)


def test_compare_bad_argument_names_it(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    page = tmp_path / "c.html"
    assert main(["compare", "1f1b", "1f1b -d 0", "-o", str(page)]) == 2
    err = capsys.readouterr().err
    assert "'1f1b -d 0'" in err and "must be >= 1" in err and "Traceback" not in err and not page.exists()


def test_file_slug_keeps_every_option() -> None:
    assert file_slug("group-interleaved d=8 m=32 v=2 · group-size 4 · offload all") == \
        "group-interleaved_d8_m32_v2_group-size_4_offload_all"
    assert file_slug("1f1b d=8 m=32 v=1 · offload first:1") == "1f1b_d8_m32_v1_offload_first-1"


def test_report_labels_name_offload_and_never_repeat() -> None:
    from pipeoffload import generate, lower, simulate
    from pipeoffload.units import rank_costs
    from pipeoffload.viz.report import html_report

    costs = rank_costs(1, 1, 1, 2).with_offload_ratio(0.5)
    plain = simulate(lower(generate("group-interleaved", 2, 4, 2), costs), costs)
    offloaded = simulate(lower(generate("group-interleaved", 2, 4, 2), costs, offload="all"), costs)
    page = html_report([plain, plain, offloaded], pictures=[b"png"] * 3)
    rows = re.findall(r"<tr data-row='\d'><td class='label'>([^<]+)</td>", page)
    assert len(set(rows)) == 3 and "offloaded" in rows[2] and "(#2 of 2)" in rows[1]
