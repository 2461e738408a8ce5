"""A dangling ``RUN/.lock`` link is refused by the library's ``RunLock`` in one line naming it, as the CLI's check
of the folder refuses it: it was opened with O_CREAT, which made its target elsewhere (where that folder
exists) or failed as if another run had removed the file, retried 100 times and blamed other runs."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeoffload.errors import ConfigError
from pipeoffload.train.runlock import RunLock


@pytest.mark.parametrize("target_folder_exists", [False, True])
def test_a_dangling_lock_link_is_one_line_naming_it(tmp_path: Path, target_folder_exists: bool) -> None:
    run = tmp_path / "run"
    run.mkdir()
    target = (tmp_path / "elsewhere" if target_folder_exists else tmp_path / "gone" / "folder") / "lockfile"
    if target_folder_exists:
        target.parent.mkdir()
    (run / ".lock").symlink_to(target)
    with pytest.raises(ConfigError) as caught:
        RunLock(run).acquire()
    text = str(caught.value)
    assert len(text.splitlines()) == 1 and ".lock" in text and str(target) in text and "does not exist" in text, text
    assert "other runs" not in text
    assert not target.exists() and (run / ".lock").is_symlink()  # nothing made elsewhere, the link left as it was
