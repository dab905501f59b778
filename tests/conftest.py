"""Shared test setup: offline, quiet, modest threads (the machine has 2 cores)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from voice.config import load_config  # noqa: E402


@pytest.fixture(scope="session")
def small_config():
    """configs/small.toml: the smallest real models."""
    return load_config("configs/small.toml", environ={})
