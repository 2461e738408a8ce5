"""``python -m pipeoffload.runtime``: see ``pipeoffload.runtime.demo`` (kept importable there so
that spawned processes can find its functions)."""
from pipeoffload.runtime.demo import main

main()
