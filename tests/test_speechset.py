"""The labelled speech sets: the same samples in every process, the right references and spans, noise at the
stated signal-to-noise ratio, every listed espeak voice really available."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from audio.frames import SPEECH_RATE
from voice.hearing.stt import SpeechToText
from voice.models import resolve
from voice.speechset import (
    COMPLETE_REQUESTS,
    PAUSED_REQUESTS,
    PAUSES_S,
    TURN_VOICES,
    VARIED_SENTENCES,
    VARIED_VOICES,
    _assemble,
    complete_turns,
    mix_at_snr,
    noise,
    normalize_words,
    paused_turns,
    speech_power,
    varied_set,
    wer,
)

ROOT = Path(__file__).resolve().parent.parent
# one espeak voice, one piper voice, one noisy voice: a checksum of their samples in a fresh process
DIGEST = """
import hashlib
from voice.speechset import VARIED_VOICES, VARIED_SENTENCES, _assemble
from audio.frames import SPEECH_RATE
h = hashlib.sha256()
for v in (VARIED_VOICES[2], VARIED_VOICES[9], VARIED_VOICES[11]):
    h.update(_assemble("check/" + v.name, v, [VARIED_SENTENCES[1]], [], 0.25, 0.25).audio.tobytes())
print(h.hexdigest())
"""


def test_samples_are_the_same_in_every_process():
    runs = [
        subprocess.run(
            [sys.executable, "-c", DIGEST], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0]) == 64
    assert varied_set() is varied_set()  # built once per process


def test_sets_cover_every_voice_and_sentence_with_the_right_references():
    varied = varied_set()
    assert len(varied) == len(VARIED_VOICES) * len(VARIED_SENTENCES)
    assert {u.voice.name for u in varied} == {v.name for v in VARIED_VOICES}
    assert sorted({u.text for u in varied}) == sorted(VARIED_SENTENCES)
    assert len({u.id for u in varied}) == len(varied)
    engines = {u.voice.engine for u in varied}
    accents = {u.voice.voice.split("+")[0] for u in varied if u.voice.engine == "espeak"}
    assert engines == {"espeak", "piper"} and len(accents) >= 6 and sum(u.voice.noise is not None for u in varied)
    durations = [u.spans[0][1] - u.spans[0][0] for u in varied]
    assert min(durations) > 1.0 and max(durations) < 4.5 and 1.6 < np.mean(durations) < 3.0

    complete = complete_turns()
    assert len(complete) == len(TURN_VOICES) * len(COMPLETE_REQUESTS)
    assert all(u.pause is None and len(u.spans) == 1 for u in complete)
    paused = paused_turns()
    assert len(paused) == len(TURN_VOICES) * len(PAUSED_REQUESTS)
    assert {u.text for u in paused} == {f"{a} {b}" for a, b in PAUSED_REQUESTS}
    lengths = [u.pause[1] - u.pause[0] for u in paused]
    assert {round(x, 3) for x in lengths} == set(PAUSES_S)
    for u in paused:
        if u.voice.noise is None:  # a clean pause is exact silence, and the speech around it is not
            a, b = (int(x * SPEECH_RATE) for x in u.pause)
            assert not u.audio[a + 1 : b - 1].any()
            assert np.abs(u.audio[int(u.spans[1][0] * SPEECH_RATE) : int(u.spans[1][1] * SPEECH_RATE)]).max() > 300


def test_references_match_what_was_said(small_config):
    """Whisper tiny.en hears the clean piper voice say each reference, and the plain espeak voice too (on
    the whole: tiny.en mishears some robotic words, "bread" as "red")."""
    stt = SpeechToText(resolve("whisper-tiny.en", "stt"), small_config.stt)
    errors = words = 0.0
    for u in varied_set():
        if u.voice.name in ("piper-joe", "espeak-us"):
            heard = "".join(w.text for w in stt.decode(u.audio.astype(np.float32) / 32768))
            if u.voice.engine == "piper":
                assert wer(u.text, heard) <= 0.15, (u.id, u.text, heard)
            else:
                errors += wer(u.text, heard) * len(normalize_words(u.text))
                words += len(normalize_words(u.text))
    assert errors / words <= 0.2
    errors = words = 0.0
    for u, halves in zip(paused_turns(), PAUSED_REQUESTS, strict=False):  # the first voice: each half on its own
        for (start, end), half in zip(u.spans, halves, strict=False):
            piece = u.audio[int((start - 0.2) * SPEECH_RATE) : int((end + 0.2) * SPEECH_RATE)]
            heard = "".join(w.text for w in stt.decode(piece.astype(np.float32) / 32768))
            heard = heard.replace("10", "ten")  # Whisper writes numbers as digits
            errors += wer(half, heard) * len(normalize_words(half))
            words += len(normalize_words(half))
    assert errors / words <= 0.2  # short halves are hard ("Add milk and" -> "Admokan."), so on the whole


@pytest.mark.parametrize("voice", [v for v in VARIED_VOICES + TURN_VOICES if v.noise is not None], ids=lambda v: v.name)
def test_noise_is_mixed_at_the_stated_snr(voice):
    noisy = next(u for u in varied_set() + complete_turns() if u.voice == voice)
    clean = _assemble(
        noisy.id,
        dataclasses.replace(voice, noise=None),
        [noisy.text],
        [],
        noisy.spans[0][0],
        len(noisy.audio) / SPEECH_RATE - noisy.spans[0][1],
    )
    assert clean.spans == noisy.spans and len(clean.audio) == len(noisy.audio)
    added = noisy.audio.astype(np.float64) - clean.audio
    inside = [added[int(a * SPEECH_RATE) : int(b * SPEECH_RATE)] for a, b in noisy.spans]
    snr = 10 * np.log10(speech_power(clean.audio, noisy.spans) / np.mean(np.square(np.concatenate(inside))))
    assert snr == pytest.approx(voice.snr_db, abs=0.05)
    lead = noisy.audio[: int(noisy.spans[0][0] * SPEECH_RATE)]
    assert np.sqrt(np.mean(np.square(lead.astype(np.float64)))) > 20  # the noise runs under the silences too


def test_noise_is_seeded_and_coloured():
    a, b, c = noise("pink", 16000, 1), noise("pink", 16000, 1), noise("pink", 16000, 2)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    for kind in ("pink", "brown", "white"):
        n = noise(kind, 4 * SPEECH_RATE, 7).astype(np.float64)
        spectrum = np.abs(np.fft.rfft(n)) ** 2
        freqs = np.fft.rfftfreq(len(n), 1 / SPEECH_RATE)
        low, high = spectrum[(freqs > 100) & (freqs < 400)].mean(), spectrum[(freqs > 3000) & (freqs < 6000)].mean()
        assert (low / high > 3) if kind != "white" else (0.5 < low / high < 2)
    speech = (np.sin(np.arange(SPEECH_RATE) / 3) * 8000).astype(np.int16)
    mixed = mix_at_snr(speech, ((0.0, 1.0),), "white", 10.0, seed=3)
    assert mixed.dtype == np.int16 and np.array_equal(mixed, mix_at_snr(speech, ((0.0, 1.0),), "white", 10.0, seed=3))
