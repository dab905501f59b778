"""Semantic end of turn on real synthetic speech with the real Smart Turn model and silero VAD: a complete
question ends after a short silence, a request with a pause in the middle is not ended at the pause, the
VAD-only rule when the model is missing; the pure policy rules; the features; the provisioned model."""

import json

import numpy as np
import pytest

from audio.end_of_turn import (
    TRANSCRIPT_PROMPT,
    EndOfTurnPolicy,
    SmartTurn,
    TurnAction,
    TurnSettings,
    log_mel,
    model_window,
    transcript_unfinished,
)
from audio.frames import SPEECH_RATE, AudioChunk
from audio.vad import Vad
from voice.config import load_config
from voice.hearing.stt import SpeechToText
from voice.models import REGISTRY, check_cache, resolve
from voice.speechset import Voice

JOE = Voice("piper-joe", "piper")
BLOCK = SPEECH_RATE // 50  # 20 ms


@pytest.fixture(scope="module")
def smart():
    return SmartTurn(resolve("smart-turn-v3.2", "turn").path)


@pytest.fixture(scope="module")
def vad():
    return Vad(resolve("silero-vad", "vad").path, end_silence_ms=10_000)  # the policy, not the VAD, ends turns


@pytest.fixture(scope="module")
def tiny(small_config):
    return SpeechToText(resolve("whisper-tiny.en", "stt"), small_config.stt)


def spoken(*pieces: str, pause_s: float = 0.6) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """The pieces in piper's voice joined by ``pause_s`` of silence, 0.5 s before and 2 s after; with the
    (start, end) second of each piece."""
    chunks, spans, t = [np.zeros(SPEECH_RATE // 2, np.int16)], [], 0.5
    for i, text in enumerate(pieces):
        audio = JOE.speak(text)
        spans.append((t, t + len(audio) / SPEECH_RATE))
        gap = pause_s if i < len(pieces) - 1 else 2.0
        chunks += [audio, np.zeros(int(gap * SPEECH_RATE), np.int16)]
        t += len(audio) / SPEECH_RATE + gap
    return np.concatenate(chunks), spans


def play(audio, vad, policy, smart=None, stt=None):
    """Feed 20 ms blocks to the VAD and the policy; answer each ASK at once (the model's run time is not
    under test) with Smart Turn on the audio so far and, given ``stt``, its transcript. Returns the END
    step and its stream time, or (None, None)."""
    vad.reset()
    for i in range(0, len(audio) - BLOCK + 1, BLOCK):
        vad.process(AudioChunk(audio[i : i + BLOCK], SPEECH_RATE, i / SPEECH_RATE))
        t = (i + BLOCK) / SPEECH_RATE
        step = policy.observe(t, vad.speaking and vad.pause_since is None, vad.pause_since)
        if step.action is TurnAction.ASK:
            heard = audio[: i + BLOCK]
            text = None
            if stt is not None:  # the words that start before the pause (none invented in the silence)
                words = stt.decode(heard.astype(np.float32) / 32768, TRANSCRIPT_PROMPT)
                text = "".join(w.text for w in words if w.start < policy.pause_start)
            step = policy.verdict(step.ask_id, smart.probability(heard), t, text)
        if step.action is TurnAction.END:
            return step, t
    return None, None


# ---- on real audio ---------------------------------------------------------------------------------------------


def test_a_complete_question_ends_after_the_short_silence(vad, smart, tiny):
    audio, spans = spoken("What is the weather like in Paris?")
    policy = EndOfTurnPolicy()  # the defaults: ask after 200 ms, end at once on "complete", else at 1 s
    step, t = play(audio, vad, policy, smart, tiny)
    assert step is not None and step.reason == "complete" and step.probability >= 0.5
    assert policy.asks == 1  # decided at the first question, after 200 ms of silence
    assert spans[0][1] < t < spans[0][1] + 0.5  # long before the 1 s limit (stream time, not wall time)


def test_a_request_with_a_pause_is_not_ended_at_the_pause(vad, smart):
    audio, spans = spoken("Turn on the", "kitchen lights.", pause_s=0.6)
    policy = EndOfTurnPolicy()
    step, t = play(audio, vad, policy, smart)  # the audio alone: "Turn on the" sounds unfinished
    assert step is not None and t > spans[1][1], f"cut at {t:.2f} s, the second half starts at {spans[1][0]:.2f} s"
    assert step.reason == "complete" and policy.asks >= 2  # asked in the pause (incomplete), then at the end


def test_the_transcript_keeps_a_pause_that_sounds_final_open(vad, smart, tiny):
    """Piper speaks "Remind me to" with a falling end, and the model alone calls it complete; the words heard
    so far ("Remind me to...", with the prompt; unprompted Whisper writes "Remind me too.") veto that, and
    the turn goes on to the real end."""
    audio, spans = spoken("Remind me to", "call my mother tomorrow.", pause_s=0.6)
    step, t = play(audio, vad, EndOfTurnPolicy(TurnSettings(use_transcript=False)), smart)
    assert step is not None and t < spans[1][0]  # audio only: cut in the pause (why the transcript matters)
    step, t = play(audio, vad, EndOfTurnPolicy(), smart, tiny)
    assert step is not None and t > spans[1][1] and step.reason == "complete"


def test_without_the_model_the_vad_rule_ends_the_turn(vad, tmp_path):
    with pytest.raises(FileNotFoundError, match="models prepare smart-turn-v3.2.*turn.engine = 'vad'"):
        SmartTurn(tmp_path / "missing.onnx")
    audio, spans = spoken("Turn on the", "kitchen lights.", pause_s=0.8)
    policy = EndOfTurnPolicy(TurnSettings(vad_silence_ms=500), model_ready=False)
    assert policy.engine == "vad"
    step, t = play(audio, vad, policy)  # never asks: no model is passed at all
    assert step is not None and step.reason == "vad_silence" and policy.asks == 0
    assert spans[0][1] + 0.4 < t < spans[1][0]  # the old rule cuts this pause, as it always did
    assert EndOfTurnPolicy(TurnSettings(engine="vad")).engine == "vad"


def test_probability_separates_finished_from_unfinished_speech(smart):
    tail = np.zeros(SPEECH_RATE // 5, np.int16)  # the 200 ms of silence the policy waits for
    done = smart.probability(np.concatenate([JOE.speak("Turn off the lights in the kitchen."), tail]))
    cut = smart.probability(np.concatenate([JOE.speak("What is the weather like in"), tail]))
    assert 0.0 <= cut < 0.5 <= done <= 1.0
    assert smart.probability(np.zeros(SPEECH_RATE, np.int16)) == pytest.approx(
        smart.probability(np.zeros(10, np.int16))
    )


# ---- features and model provisioning --------------------------------------------------------------------------


def test_features_match_whisper_feature_extractor():
    from transformers import WhisperFeatureExtractor

    audio = np.concatenate([JOE.speak("Open the garage door."), np.zeros(3200, np.int16)])
    window = model_window(audio)
    reference = WhisperFeatureExtractor(chunk_length=8)(
        window,
        sampling_rate=SPEECH_RATE,
        return_tensors="np",
        padding="max_length",
        max_length=len(window),
        truncation=True,
        do_normalize=True,
    ).input_features[0]
    ours = log_mel(window)
    assert ours.shape == reference.shape == (80, 800)
    assert np.abs(ours - reference).max() < 1e-3


def test_model_window_keeps_the_end_and_pads_in_front():
    short = np.arange(1, 101, dtype=np.int16)
    window = model_window(short)
    assert len(window) == 8 * SPEECH_RATE and not window[:-100].any() and window[-1] == pytest.approx(100 / 32768)
    long = np.arange(9 * SPEECH_RATE, dtype=np.float32) / (9 * SPEECH_RATE)
    assert model_window(long)[0] == long[SPEECH_RATE] and model_window(long)[-1] == long[-1]
    with pytest.raises(ValueError, match="model_window"):
        log_mel(np.zeros(100, np.float32))


def test_provisioning_gave_the_model_with_its_bsd_licence():
    folder = resolve("smart-turn-v3.2", "turn").path
    assert REGISTRY["smart-turn-v3.2"].kind == "turn" and check_cache(folder, full=True) is None
    assert (folder / "smart-turn-v3.2-cpu.onnx").stat().st_size > 8_000_000
    licence = (folder / "LICENSE").read_text()
    assert licence.startswith("BSD 2-Clause License") and "Daily" in licence
    source = json.loads((folder / "SOURCE.json").read_text())
    assert source["licence"] == "BSD-2-Clause" and source["wheel"] == "pipecat_ai-1.14.0-py3-none-any.whl"


def test_config_section_maps_onto_the_policy_settings():
    config = load_config("configs/default.toml", environ={})
    assert config.models.turn == "smart-turn-v3.2" and config.turn.engine == "smart"
    settings = TurnSettings(**config.turn.model_dump(exclude={"threads"}), vad_silence_ms=config.vad.end_silence_ms)
    assert settings.min_silence_ms < settings.max_silence_ms and settings.vad_silence_ms == 500
    with pytest.raises(Exception, match="min_silence_ms"):
        load_config("configs/default.toml", ["turn.min_silence_ms=900", "turn.max_silence_ms=800"], environ={})


# ---- the policy's rules, on a synthetic clock -----------------------------------------------------------------


def feed(policy, start, end, speech, step_s=0.02):
    """Observe blocks from ``start`` to ``end`` (seconds); return the non-WAIT steps with their times."""
    out = []
    for k in range(round((end - start) / step_s)):
        t = round(start + (k + 1) * step_s, 6)
        step = policy.observe(t, speech)
        if step.action is not TurnAction.WAIT:
            out.append((t, step))
    return out


def test_policy_asks_once_after_min_silence_and_ends_on_complete():
    policy = EndOfTurnPolicy(TurnSettings(min_silence_ms=200, max_silence_ms=1000, reask_ms=0))
    assert feed(policy, 0.0, 1.0, False) == []  # silence before any speech: nothing to end
    assert feed(policy, 1.0, 2.0, True) == []
    ((t, ask),) = feed(policy, 2.0, 2.3, False)
    assert ask.action is TurnAction.ASK and t == pytest.approx(2.2) and ask.silence_s == pytest.approx(0.2)
    end = policy.verdict(ask.ask_id, 0.9, 2.25)
    assert end.action is TurnAction.END and end.reason == "complete" and end.silence_s == pytest.approx(0.25)
    assert feed(policy, 2.3, 4.0, False) == []  # ended: waits for new speech


def test_policy_waits_for_max_silence_after_incomplete_and_reasks():
    policy = EndOfTurnPolicy(TurnSettings(min_silence_ms=200, max_silence_ms=1000, reask_ms=300))
    feed(policy, 0.0, 1.0, True)
    steps = []
    for k in range(1, 76):
        t = round(1.0 + 0.02 * k, 6)
        step = policy.observe(t, False)
        if step.action is TurnAction.ASK:
            assert policy.verdict(step.ask_id, 0.1, t).reason == "incomplete"
        if step.action is not TurnAction.WAIT:
            steps.append((round(t, 2), step.action, step.reason))
    assert steps == [
        (1.2, TurnAction.ASK, ""),
        (1.5, TurnAction.ASK, ""),
        (1.8, TurnAction.ASK, ""),
        (2.0, TurnAction.END, "max_silence"),
    ]


def test_a_late_answer_about_an_ended_pause_is_ignored():
    policy = EndOfTurnPolicy(TurnSettings(min_silence_ms=200, max_silence_ms=1000))
    feed(policy, 0.0, 1.0, True)
    ((_, ask),) = feed(policy, 1.0, 1.2, False)
    assert feed(policy, 1.2, 1.4, False) == []  # one question at a time
    feed(policy, 1.4, 1.6, True)  # the user goes on while the model runs
    assert policy.verdict(ask.ask_id, 0.99, 1.61).action is TurnAction.WAIT
    ((_, again),) = feed(policy, 1.6, 1.8, False)
    assert again.ask_id != ask.ask_id
    assert policy.verdict(again.ask_id, 0.99, 1.81).action is TurnAction.END


def test_max_silence_ends_the_turn_while_the_model_is_still_running():
    policy = EndOfTurnPolicy(TurnSettings(min_silence_ms=200, max_silence_ms=600))
    feed(policy, 0.0, 1.0, True)
    steps = feed(policy, 1.0, 1.7, False)
    assert [s.action for _, s in steps] == [TurnAction.ASK, TurnAction.END] and steps[1][1].reason == "max_silence"
    assert policy.verdict(steps[0][1].ask_id, 0.99, 1.7).action is TurnAction.WAIT  # too late: already over


def test_vad_pause_start_is_used_when_given():
    policy = EndOfTurnPolicy(TurnSettings(engine="vad", vad_silence_ms=500))
    policy.observe(1.0, True)
    assert policy.observe(1.2, False, pause_start=0.95).silence_s == pytest.approx(0.25)
    assert policy.observe(1.45, False).action is TurnAction.END


def test_transcript_rule():
    for text in ("Set a timer for...", "Turn on the", "Add milk and", "Send a message to", "so um", "Well,"):
        assert transcript_unfinished(text), text
    assert transcript_unfinished("What is the weather like in?")  # Whisper's "?" does not finish it
    for text in ("", "Turn the lights on.", "What is the weather like in Paris?", "Call her.", "Switch it off"):
        assert not transcript_unfinished(text), text
    assert not transcript_unfinished("Call me.") and not transcript_unfinished("Tell me a joke.")
    for text in ("Yes...", "Stop\u2026", "Remember..."):  # a one-word reply, as the pause prompt writes it
        assert not transcript_unfinished(text), text
    for text in ("The...", "Yes, and...", "Can you tell me...", "Yes,", "Can you tell me?", "Show me"):
        assert transcript_unfinished(text), text
    policy = EndOfTurnPolicy(TurnSettings(use_transcript=False))
    policy.observe(1.0, True)
    ask = policy.observe(1.2, False)
    assert policy.verdict(ask.ask_id, 0.9, 1.2, "Turn on the").action is TurnAction.END


def test_settings_are_checked():
    for bad in (
        {"engine": "magic"},
        {"threshold": 1.0},
        {"min_silence_ms": 900, "max_silence_ms": 800},
        {"reask_ms": -1},
    ):
        with pytest.raises(ValueError):
            TurnSettings(**bad)
