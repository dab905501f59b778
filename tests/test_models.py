"""Model provisioning: each source, the offline hub-id error, concurrent builders, damaged caches, and every
embedded model loaded for real and producing output."""

import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from voice import models
from voice.models import MANIFEST, ModelError, check_cache, resolve

ROOT = Path(__file__).resolve().parent.parent


def test_package_source_resolves_to_real_files():
    r = resolve("whisper-tiny.en", "stt")
    assert r.source == "package" and (r.path / "model.bin").stat().st_size > 10_000_000
    voice = resolve("piper-joe-medium", "tts").path
    assert voice.suffix == ".onnx" and Path(str(voice) + ".json").exists()


def test_local_path_source(tmp_path):
    folder = resolve("whisper-tiny.en", "stt").path
    r = resolve(str(folder), "stt")
    assert r.source == "path" and r.path == folder


def test_missing_local_path_is_named():
    with pytest.raises(ModelError, match="does not exist"):
        resolve("./models/nothing-here", "llm")


def test_offline_hub_id_names_package_and_setting(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as err:
        resolve("Qwen/Qwen2.5-0.5B-Instruct", "llm")
    msg = str(err.value)
    assert "offline" in msg and "specvoice[models]" in msg and "qwen2.5-coder-1.5b-instruct" in msg


def test_online_hub_id_passes_through(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    r = resolve("Systran/faster-whisper-small", "stt")
    assert r.source == "hub" and r.hub_id == "Systran/faster-whisper-small" and r.path is None


def test_wrong_kind_is_refused():
    with pytest.raises(ModelError, match="is a stt model, not a llm model"):
        resolve("whisper-base", "llm")


def prepare(cache: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "voice.app.cli", "-v", "--set", f"models.cache_dir={cache}", "models", "prepare", name],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def test_two_processes_prepare_the_same_model(tmp_path):
    procs = [prepare(tmp_path, "whisper-base") for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    builds = sum(err.count("building model cache") for _, err in outputs)
    assert builds == 1, "the second process must wait for the first and reuse its build"
    assert check_cache(tmp_path / "whisper-base", full=True) is None
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert leftovers == []


def test_truncated_and_corrupt_cache_are_rebuilt(tmp_path):
    entry = models.REGISTRY["whisper-base"]
    folder = models.build_entry(entry, tmp_path)
    target = folder / "model.bin"
    good = target.stat().st_size
    with open(target, "r+b") as fh:  # truncation: caught by the cheap size check on every resolve
        fh.truncate(good // 2)
    assert "truncated" in check_cache(folder, full=False)
    folder = models.build_entry(entry, tmp_path)
    assert target.stat().st_size == good and check_cache(folder, full=True) is None
    stamp = target.stat().st_mtime_ns
    with open(target, "r+b") as fh:  # same size, flipped bytes: the changed mtime makes the cheap check hash it
        fh.seek(1000)
        fh.write(b"\x00" * 64)
    assert "corrupt" in check_cache(folder, full=False)
    os.utime(target, ns=(stamp, stamp))  # flipped bytes behind an unchanged stamp: only the full check hashes
    assert check_cache(folder, full=False) is None
    assert "corrupt" in check_cache(folder, full=True)
    folder = models.build_entry(entry, tmp_path, full_check=True)
    assert check_cache(folder, full=True) is None


def test_interrupted_build_leaves_no_entry(tmp_path):
    def boom(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x" * 10)
        raise OSError("disk full")

    entry = models.Entry("broken", "stt", ("nothing",), boom, lambda: tmp_path / "broken", cached=True)
    with pytest.raises(OSError):
        models.build_entry(entry, tmp_path)
    assert not (tmp_path / "broken").exists() and not list(tmp_path.glob(".broken.tmp-*"))


@pytest.fixture
def full_disk(tmp_path):
    """A model cache on a 2 MB tmpfs (mounted for the test: CI runs as root), too small for any model."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(tiny)], check=True, capture_output=True)
    try:
        yield tiny
    finally:
        subprocess.run(["umount", str(tiny)], check=True, capture_output=True)


def test_a_full_disk_while_preparing_is_one_clear_line_and_leaves_nothing_half_written(full_disk):
    """The disk fills while Smart Turn's wheel is fetched into the cache (the real ENOSPC from pip): exit 2,
    the error names the cache, the size needed and the fix; no half-built folder is left to be taken for a
    model."""
    run = subprocess.run(
        [sys.executable, "-m", "voice.app.cli", "models", "prepare", "smart-turn-v3.2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "SPECVOICE_CACHE": str(full_disk)},
    )
    assert run.returncode == 2, run.stderr
    assert f"no space left in the model cache {full_disk} while preparing smart-turn-v3.2" in run.stderr
    assert "fix: free space there" in run.stderr and "Traceback" not in run.stderr
    assert [p.name for p in full_disk.iterdir() if not p.name.endswith(".lock")] == []
    assert "missing" in models.status("smart-turn-v3.2", cache_dir=str(full_disk))


def test_models_verify_cli_reports_healthy():
    result = subprocess.run(
        [sys.executable, "-m", "voice.app.cli", "models", "verify"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    for name in ("smollm2-135m-instruct", "whisper-tiny.en", "piper-joe-medium", "silero-vad"):
        assert lines[name].split()[1] == "ok"


# ---- every embedded model loads and produces output ------------------------------------------------------


def piper_wav(text: str, path: Path) -> Path:
    from piper import PiperVoice

    voice = PiperVoice.load(str(resolve("piper-joe-medium", "tts").path))
    with wave.open(str(path), "wb") as wav:
        voice.synthesize_wav(text, wav)
    return path


def test_piper_produces_a_waveform(tmp_path):
    path = piper_wav("Hello there.", tmp_path / "hello.wav")
    with wave.open(str(path)) as wav:
        assert wav.getframerate() == 22050 and wav.getnframes() > 22050 * 0.3
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    assert np.abs(samples).max() > 1000


@pytest.mark.parametrize("name", ["whisper-tiny.en", pytest.param("whisper-base", marks=pytest.mark.big)])
def test_whisper_produces_a_transcript(tmp_path, name):
    from faster_whisper import WhisperModel

    path = piper_wav("The weather is sunny today.", tmp_path / "q.wav")
    model = WhisperModel(str(resolve(name, "stt").path), device="cpu", compute_type="int8", cpu_threads=2)
    segments, _ = model.transcribe(str(path), beam_size=1, language="en")
    text = " ".join(s.text for s in segments).lower()
    assert "weather" in text and "sunny" in text


def test_silero_vad_scores_speech_above_silence(tmp_path):
    import onnxruntime as ort
    import soxr

    path = piper_wav("Speech is here.", tmp_path / "s.wav")
    with wave.open(str(path)) as wav:
        speech = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16).astype(np.float32) / 32768
    speech = soxr.resample(speech, 22050, 16000)
    session = ort.InferenceSession(str(resolve("silero-vad", "vad").path), providers=["CPUExecutionProvider"])

    def max_prob(audio):
        state, best = np.zeros((2, 1, 128), np.float32), 0.0
        context = np.zeros(64, np.float32)
        for i in range(0, len(audio) - 512, 512):
            window = np.concatenate([context, audio[i : i + 512]])[None, :]
            out, state = session.run(None, {"input": window, "state": state, "sr": np.array(16000, np.int64)})
            context = audio[i + 448 : i + 512]
            best = max(best, float(out[0][0]))
        return best

    assert max_prob(speech) > 0.8 and max_prob(np.zeros(16000, np.float32)) < 0.2


@pytest.mark.parametrize(
    "name",
    [
        "smollm2-135m-instruct",
        pytest.param("qwen2.5-coder-0.5b-instruct", marks=pytest.mark.big),
        pytest.param("qwen2.5-coder-1.5b-instruct", marks=pytest.mark.big),
    ],
)
def test_llm_produces_a_token(name):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve(name, "llm").path
    assert (folder / MANIFEST).exists()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text
