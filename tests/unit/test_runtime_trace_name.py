"""`python -m pipeoffload.runtime --trace` refuses a name whose extension is not a trace's, in the
words of `simulate --trace`: `--trace run.html` was accepted and got JSON."""
from pathlib import Path

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize("name", ["run.html", "run"])
def test_the_runtime_refuses_a_trace_name_simulate_refuses(tmp_path: Path, capsys, name: str) -> None:  # type: ignore[no-untyped-def]
    from pipeoffload.runtime.demo import main

    path = tmp_path / name
    with pytest.raises(SystemExit) as done:
        main(["--spawn", "1", "--schedule", "1f1b", "--microbatches", "2", "--steps", "1", "--layers", "2",
              "--hidden", "32", "--seq", "16", "--trace", str(path)])
    err = capsys.readouterr().err
    code, _, simulate_err = run_cli("simulate", "1f1b", "--trace", str(path))
    assert done.value.code == 2 and code == 2 and not path.exists(), err
    assert err.split(": error: ", 1)[1] == simulate_err.split(": error: ", 1)[1], (err, simulate_err)


def test_the_runtime_says_where_it_wrote_the_trace(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from pipeoffload.runtime.demo import main

    path = tmp_path / "run.json"
    main(["--spawn", "1", "--schedule", "1f1b", "--microbatches", "2", "--steps", "1", "--layers", "2",
          "--hidden", "32", "--seq", "16", "--trace", str(path)])
    out = capsys.readouterr().out
    assert path.is_file() and f"wrote {path} (open in https://ui.perfetto.dev;" in out, out
