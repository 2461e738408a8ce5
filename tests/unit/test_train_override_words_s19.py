"""What `train` prints (and config.toml keeps as comments) about keys a flag or a resume overrides writes each
value as the TOML file does: it read "async_save False -> True" and "schedule '1f1b' -> 'zb-v'" in Python's words."""
from __future__ import annotations

from pathlib import Path


def test_overrides_are_written_in_toml_words(tmp_path: Path) -> None:
    from pipeoffload.cli import build_parser
    from pipeoffload.cli.train import resolve

    file = tmp_path / "run.toml"
    file.write_text('[checkpoint]\nasync_save = false\n[schedule]\nfamily = "1f1b"\n')
    args = build_parser().parse_args(["train", "--config", str(file), "--async-save", "--schedule", "gpipe"])
    _, notes = resolve(args)
    line = next(n for n in notes if n.startswith("flags overriding"))
    assert "async_save false -> true" in line and 'schedule "1f1b" -> "gpipe"' in line, line

