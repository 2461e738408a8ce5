# Two commands: `make demo` (the main job on this machine) and `make test` (the test suite).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH := torch==2.13.0

.PHONY: demo test lint setup clean gpu-check wheel

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[dev,train]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) -m pipeoffload.demo

lint: setup
	$(VENV)/bin/ruff check pipeoffload tests benchmarks examples
	$(VENV)/bin/mypy pipeoffload
	$(VENV)/bin/lint-imports --no-cache  # the layers of docs/architecture.md ([tool.importlinter] in pyproject.toml)

test: lint
	$(PY) -m pytest -q -x --durations=10

# On a CUDA machine: tests/gpu, the offload replay benchmark and a 1-GPU training run (< 8 min);
# writes benchmarks/results/gpu_check.txt. Without CUDA it says so and exits 0.
gpu-check: setup
	$(PY) benchmarks/gpu_check.py

# the sdist and the wheel into dist/ (.ci/run installs the wheel in a fresh venv and runs it)
wheel: setup
	rm -rf dist && $(PY) -m build --outdir dist . >/dev/null

clean:
	rm -rf $(VENV) build dist *.egg-info
