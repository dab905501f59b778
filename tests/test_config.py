"""Config files: valid ones load; each kind of broken one gives an error naming the file, the key and the fix."""

import subprocess
import sys
from pathlib import Path

import pytest

from voice.config import ConfigError, load_config, stt_hotwords

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["default", "small", "gpu"])
def test_shipped_configs_load(name):
    config = load_config(ROOT / "configs" / f"{name}.toml", environ={})
    assert config.server.host == "127.0.0.1"  # secure by default in every shipped config


def test_small_config_uses_small_models(small_config):
    assert small_config.models.target == "smollm2-135m-instruct"
    assert small_config.models.stt == "whisper-tiny.en"


def write(tmp_path, text):
    path = tmp_path / "broken.toml"
    path.write_text(text)
    return path


def test_unknown_key_names_file_key_and_fix(tmp_path):
    path = write(tmp_path, "[llm]\nmax_new_tokns = 10\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    msg = str(err.value)
    assert str(path) in msg and "llm.max_new_tokns" in msg and "check its spelling" in msg


def test_unknown_section(tmp_path):
    with pytest.raises(ConfigError, match=r"speeker.*check its spelling"):
        load_config(write(tmp_path, "[speeker]\nvolume = 3\n"), environ={})


def test_wrong_type_names_key_and_value(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, '[vad]\nend_silence_ms = "soon"\n'), environ={})
    assert "vad.end_silence_ms" in str(err.value) and "'soon'" in str(err.value)


def test_out_of_range_and_bad_choice(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, '[llm]\ntop_p = 3.0\ndtype = "int3"\n'), environ={})
    assert "llm.top_p" in str(err.value) and "llm.dtype" in str(err.value)


def test_toml_syntax_error_names_file(tmp_path):
    path = write(tmp_path, "[llm\nmode = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, environ={})


def test_draft_mode_needs_a_draft(tmp_path):
    with pytest.raises(ConfigError, match="needs models.draft"):
        load_config(write(tmp_path, '[models]\ntarget = "x"\n[llm]\nmode = "draft"\n'), environ={})


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/specvoice.toml", environ={})


def test_env_and_flag_overrides_in_order():
    env = {"SPECVOICE_LLM__MAX_NEW_TOKENS": "12", "SPECVOICE_SERVER__HOST": "0.0.0.0"}
    config = load_config(ROOT / "configs/small.toml", environ=env)
    assert config.llm.max_new_tokens == 12 and config.server.host == "0.0.0.0"
    config = load_config(ROOT / "configs/small.toml", overrides=["llm.max_new_tokens=7"], environ=env)
    assert config.llm.max_new_tokens == 7  # the flag beats the environment


def test_bad_env_override_is_named():
    with pytest.raises(ConfigError, match=r"SPECVOICE_LLM__TEMPERATURE"):
        load_config(ROOT / "configs/small.toml", environ={"SPECVOICE_LLM__TEMPERATURE": "hot"})
    with pytest.raises(ConfigError, match=r"SPECVOICE_TTS__NOISE_SCALE"):
        load_config(ROOT / "configs/small.toml", environ={"SPECVOICE_TTS__NOISE_SCALE": "-1"})


def cli(*args, env=None):
    import os

    return subprocess.run(
        [sys.executable, "-m", "voice.app.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        timeout=120,
    )


def test_cli_config_check_reports_missing_model(tmp_path):
    path = write(tmp_path, '[models]\ntarget = "./no/such/model"\n[llm]\nmode = "target"\n')
    result = cli("config", "check", str(path))
    assert result.returncode == 2
    assert "models.target" in result.stderr and "does not exist" in result.stderr


def test_cli_config_check_offline_hub_id(tmp_path):
    path = write(tmp_path, '[models]\ntarget = "Qwen/Qwen2.5-7B-Instruct"\n[llm]\nmode = "target"\n')
    result = cli("config", "check", str(path))
    assert result.returncode == 2 and "offline" in result.stderr and "specvoice[models]" in result.stderr


def test_cli_config_show_prints_effective_values():
    result = cli("-c", "configs/small.toml", "--set", "llm.max_new_tokens=5", "config", "show")
    assert result.returncode == 0, result.stderr
    assert "max_new_tokens = 5" in result.stdout and 'target = "smollm2-135m-instruct"' in result.stdout


def test_cli_broken_config_exit_code(tmp_path):
    result = cli("-c", str(write(tmp_path, "[llm]\nnope = 1\n")), "config", "show")
    assert result.returncode == 2 and "llm.nope" in result.stderr


def test_cli_demo_with_a_bad_question_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "question.wav"
    bad.write_bytes(b"RIFF\x00\x00")
    result = cli("-c", "configs/small.toml", "demo", "--in", str(bad), "--out", str(tmp_path / "a.wav"))
    assert result.returncode == 2, result.stderr
    assert "question.wav" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "text, key",
    [
        ("[llm]\ntree_width = 0\n", "llm.tree_width"),
        ('[llm]\ntree = "sometimes"\n', "llm.tree"),
        ('[dialog]\nearly_reply = "maybe"\n', "dialog.early_reply"),
        ("[stt]\nwindow_s = 45\n", "stt.window_s"),
        ('[stt]\nwindow_s = "fitted"\n', "stt.window_s"),
        ("[tts]\nnoise_scale = -0.1\n", "tts.noise_scale"),
        ('[tts]\nnoise_w_scale = "calm"\n', "tts.noise_w_scale"),
        ('[llm]\nhuge_pages = "always"\n', "llm.huge_pages"),
        ('[dialog]\nbackchannels = "sometimes"\n', "dialog.backchannels"),
        ("[dialog]\nbackchannel_hold_s = 0\n", "dialog.backchannel_hold_s"),
        ('[mqtt]\naction_format = "json"\n', "mqtt.action_format"),
        ('[audio]\nnoise_suppression = "loud"\n', "audio.noise_suppression"),
        ("[audio]\nfollow_up_s = -1\n", "audio.follow_up_s"),
        ('[audio]\nfollow_up_s = "soon"\n', "audio.follow_up_s"),
        ("[models]\nwake_word = 3\n", "models.wake_word"),
        ("[mqtt]\ncommand_timeout_s = 0\n", "mqtt.command_timeout_s"),
        ("[mqtt]\ncommand_timeout_s = 600\n", "mqtt.command_timeout_s"),
        ('[mqtt]\ncommand_timeout_s = "soon"\n', "mqtt.command_timeout_s"),
    ],
)
def test_bad_tree_and_early_reply_values_name_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), environ={})
    assert key in str(err.value)


def test_stt_hotwords_default_to_the_devices_and_a_bad_list_names_the_key_and_fix(tmp_path):
    NGRAM = '[llm]\nmode = "ngram"\n'  # a config that loads without a draft model
    devices = (
        '[[mqtt.devices]]\nname = "towel warmer"\ntopic = "home/b/w/set"\npayloads = ["ON"]\narea = "bathroom"\n'
        '[[mqtt.devices]]\nname = "sprinkler"\ntopic = "home/g/s/set"\npayloads = ["ON"]\narea = "garden"\n'
    )
    home = load_config(write(tmp_path, NGRAM + devices), environ={})
    assert home.stt.hotwords is None  # unset: stt_hotwords fills it from the devices, names first
    assert stt_hotwords(home.stt, home.mqtt) == ["towel warmer", "sprinkler", "bathroom", "garden"]
    own = load_config(write(tmp_path, NGRAM + '[stt]\nhotwords = ["Nanoleaf", " Nanoleaf "]\n' + devices), environ={})
    assert stt_hotwords(own.stt, own.mqtt) == ["Nanoleaf"]  # set: exactly these (spaces tidied, once each)
    off = load_config(write(tmp_path, NGRAM + "[stt]\nhotwords = []\n" + devices), environ={})
    assert stt_hotwords(off.stt, off.mqtt) == []
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, NGRAM + '[stt]\nhotwords = ["sprinkler", " "]\n'), environ={})
    assert "stt.hotwords" in str(err.value) and "empty phrase; fix: remove it" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(
            write(tmp_path, NGRAM + f"[stt]\nhotwords = {[f'garden gnome lamp number {i}' for i in range(40)]}\n"),
            environ={},
        )
    assert "stt.hotwords" in str(err.value) and "fix: list only the names" in str(err.value)
    with pytest.raises(ConfigError, match=r"stt\.hotwords"):
        load_config(write(tmp_path, NGRAM + '[stt]\nhotwords = "sprinkler"\n'), environ={})


@pytest.mark.parametrize("flag", ["--ks", "--tree-ks", "--tree-widths", "--hf-ks"])
def test_bench_llm_bad_list_flag_is_refused_before_any_model_loads(flag):
    result = cli("-c", "configs/small.toml", "bench", "llm", flag, "2,x")
    assert result.returncode == 2 and flag in result.stderr and "positive integers" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_llm_engine_follows_the_device_and_a_wrong_one_names_the_fix(tmp_path):
    cpu = load_config(write(tmp_path, '[llm]\nmode = "ngram"\n'), environ={})
    assert cpu.llm.engine == "llama.cpp"  # no engine named: llama.cpp on the CPU ...
    gpu = load_config(write(tmp_path, '[llm]\nmode = "ngram"\ndevice = "cuda"\n'), environ={})
    assert gpu.llm.engine == "torch"  # ... torch on a GPU
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, '[llm]\nmode = "ngram"\nengine = "vllm"\n'), environ={})
    assert "llm.engine" in str(err.value) and "llama.cpp" in str(err.value)
    with pytest.raises(ConfigError, match=r"llm.engine = 'llama.cpp' runs on the CPU.*fix: set llm.engine = 'torch'"):
        load_config(write(tmp_path, '[llm]\nmode = "ngram"\nengine = "llama.cpp"\ndevice = "cuda"\n'), environ={})


def test_the_llm_defaults_are_the_llm_packages():
    """llm/settings.py owns the llm defaults: the config states none of its own, and the engines (built from
    these settings) get what the config shows."""
    from dataclasses import asdict

    from llm.settings import DecodeSettings, LoadSettings, default_engine
    from voice.config import LLMConfig

    config = LLMConfig().model_dump()
    owned = {**asdict(DecodeSettings()), **asdict(LoadSettings(engine=default_engine("cpu")))}
    shared = set(config) & set(owned)
    assert {"context_limit", "draft_quantize", "max_draft_length", "prefill_chunk", "engine"} <= shared
    assert {key: config[key] for key in shared} == {key: owned[key] for key in shared}
    assert LoadSettings.from_config(config) == LoadSettings(engine=config["engine"])


def test_an_unknown_wake_word_names_the_ones_there_are():
    from voice.hearing.parts import wake_word
    from voice.models import ModelError

    config = load_config(ROOT / "configs" / "small.toml", environ={}, overrides=["models.wake_word=hey_alexa"])
    with pytest.raises(ModelError) as err:
        wake_word(config)
    assert "hey_alexa" in str(err.value) and "hey_jarvis" in str(err.value) and "fix:" in str(err.value)
