"""``python -m pipeoffload.runtime``: see ``pipeoffload.runtime.demo`` (kept importable there so
that spawned processes can find its functions). Without torch it prints the one line the ``pipeoffload``
commands print (``errors.missing_extra``) and exits 2, not a traceback."""
import sys
from collections.abc import Callable

from pipeoffload.errors import missing_extra


def demo_main() -> Callable[[], None]:
    try:
        from pipeoffload.runtime.demo import main
    except ModuleNotFoundError as err:
        line = missing_extra(err)
        if line is None:
            raise
        print(f"python -m pipeoffload.runtime: error: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    return main


demo_main()()
