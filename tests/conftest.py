"""Shared test setup: offline, quiet, modest threads (the machine has 2 cores)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests that compare Whisper's words need the same audio every run. Whisper through CTranslate2 int8 is
# deterministic here (the same samples give bit-identical scores run to run, with 1 or 2 threads, on a busy
# machine), but piper samples noise inside its model, so its speech differs each run and tiny.en hears
# near-homophones differently ("moon" as "mint"). Piper's noise is off in every test's synthesis: these two
# reach the configs of servers the tests start, and the test utterances (tests/speech.py) are made the same way.
DETERMINISTIC_TTS = {"SPECVOICE_TTS__NOISE_SCALE": "0", "SPECVOICE_TTS__NOISE_W_SCALE": "0"}
for _name, _value in DETERMINISTIC_TTS.items():
    os.environ.setdefault(_name, _value)

import pytest  # noqa: E402

from voice.config import load_config  # noqa: E402


@pytest.fixture(scope="session")
def small_config():
    """configs/small.toml: the smallest real models."""
    return load_config("configs/small.toml", environ=DETERMINISTIC_TTS)
