# moeslots: `make run` (the app on the bundled default model) and `make test`.
# Both create .venv, install moeslots with its deps, and build + install the patched engine
# (llama-cpp-python 0.3.36 from PyPI + engine/patches/, cached under ~/.cache/moeslots by patch hash):
# the CUDA engine when nvidia-smi lists a GPU and nvcc is found, else the CPU engine (one line says which and why).
# ENGINE_FLAGS=--cpu or --cuda forces one: make engine ENGINE_FLAGS=--cpu

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.moeslots-deps
ENGINE_FLAGS ?=

.PHONY: run test engine venv clean doctor

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	PYTHONWARNINGS=ignore $(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

engine: $(STAMP)
	$(PY) -m moeslots engine build $(ENGINE_FLAGS)

run: engine
	$(PY) -m moeslots app --bundled

test: engine
	$(PY) -m pytest -q

doctor: engine
	$(PY) -m moeslots doctor

clean:
	rm -rf $(VENV) .pytest_cache
