"""Incremental TTS with the real piper voice: PCM chunks out of an async stream, cancellation between
sentences, and a round trip through Whisper back to the same words."""

import asyncio

import numpy as np
import pytest

from audio.resample import resample
from voice.hearing.stt import SpeechToText
from voice.models import ModelError, Resolved, resolve
from voice.speaking.chunker import Chunker
from voice.speaking.tts import TextToSpeech

from speech import spoken_as, wer


@pytest.fixture(scope="module")
def tts(small_config):
    return TextToSpeech(resolve(small_config.models.tts, "tts"), small_config.tts)


async def test_stream_yields_int16_chunks_at_the_voice_rate(tts):
    chunks = [c async for c in tts.stream("The kitchen light is on.")]
    assert tts.sample_rate == 22050
    assert chunks and all(c.dtype == np.int16 and c.ndim == 1 for c in chunks)
    audio = np.concatenate(chunks)
    assert 0.8 < len(audio) / tts.sample_rate < 4.0 and np.abs(audio).max() > 3000
    assert [c async for c in tts.stream("   ")] == []


async def test_noise_scales_at_zero_make_the_same_audio_every_time(tts, small_config):
    """The tests run piper without its sampling noise (tests/conftest.py); the voice's own noise (the default,
    ``tts.noise_scale`` unset) renders the same text differently each time."""
    text = "The garage door is closed."
    assert small_config.tts.noise_scale == small_config.tts.noise_w_scale == 0

    async def say(voice: TextToSpeech) -> np.ndarray:
        return np.concatenate([c async for c in voice.stream(text)])

    assert np.array_equal(await say(tts), await say(tts))
    noisy = TextToSpeech(
        resolve(small_config.models.tts, "tts"),
        small_config.tts.model_copy(update={"noise_scale": None, "noise_w_scale": None}),
    )
    first, second = await say(noisy), await say(noisy)
    assert len(first) != len(second) or not np.array_equal(first, second)


async def test_round_trip_piper_to_whisper_gives_the_same_words(tts, small_config):
    stt = SpeechToText(resolve(small_config.models.stt, "stt"), small_config.stt)
    text = "Please open the garage door and turn off the heating in the bedroom."
    chunker = Chunker()
    pcm = []
    for fragment in chunker.push(text) + chunker.flush():
        pcm += [c async for c in tts.stream(fragment)]
    heard = await stt.transcribe(resample(np.concatenate(pcm), tts.sample_rate, 16000))
    # tiny.en's accuracy, not run-to-run change (the audio is the same every run): two words of the twelve
    assert spoken_as(text, heard), heard


async def test_closing_the_stream_stops_synthesis_before_the_next_sentence(tts):
    text = " ".join(["This sentence is one of many."] * 8)  # piper makes one chunk per sentence
    full = [c async for c in tts.stream(text)]
    assert len(full) == 8
    before = tts.chunks_made
    stream = tts.stream(text)
    first = await anext(stream)
    await stream.aclose()
    assert first.dtype == np.int16 and len(first) > 0
    await asyncio.wait_for(anext(tts.stream("Next.")), timeout=5)  # waits for the worker to let go
    # the worker stopped after the sentence it was making when the stream closed, not after all eight
    assert tts.chunks_made - before - 1 <= 3


async def test_cancelling_the_consumer_task_stops_the_stream(tts):
    got = []

    async def consume():
        async for chunk in tts.stream(" ".join(["Another sentence is spoken here."] * 20)):
            got.append(chunk)
            await asyncio.sleep(0)

    task = asyncio.create_task(consume())
    while not got:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 1 <= len(got) < 20


def test_missing_voice_config_is_a_clear_error(tmp_path, small_config):
    onnx = tmp_path / "voice.onnx"
    onnx.write_bytes(b"x")
    with pytest.raises(ModelError, match=r"no voice.onnx.json beside it"):
        TextToSpeech(Resolved("v", "tts", "path", path=onnx), small_config.tts)


def test_broken_voice_config_is_a_clear_error(tmp_path, small_config):
    onnx = tmp_path / "voice.onnx"
    onnx.write_bytes(b"x")
    (tmp_path / "voice.onnx.json").write_text('{"audio": ')
    with pytest.raises(ModelError, match=r"voice.onnx.json is unreadable.*fix"):
        TextToSpeech(Resolved("v", "tts", "path", path=onnx), small_config.tts)


def test_say_and_transcribe_commands_round_trip(tmp_path, capsys):
    from voice.app.cli import main

    out = tmp_path / "said.wav"
    assert main(["-c", "configs/small.toml", "say", "Turn off the lights in the hall, please.", "-o", str(out)]) == 0
    assert "first audio after" in capsys.readouterr().err
    assert main(["-c", "configs/small.toml", "transcribe", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    # tiny.en may mishear one word of the eight (the audio is the same every run: piper's noise is off)
    assert wer("Turn off the lights in the hall, please.", printed[-1]) <= 1 / 8, printed[-1]
    assert all(line.startswith("... ") for line in printed[:-1])  # partials came first


def test_transcribe_command_rejects_a_bad_file_clearly(tmp_path, capsys):
    from voice.app.cli import main

    (tmp_path / "empty.wav").write_bytes(b"")
    assert main(["-c", "configs/small.toml", "transcribe", str(tmp_path / "empty.wav")]) == 2
    assert "is empty (0 bytes); fix:" in capsys.readouterr().err
