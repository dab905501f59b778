"""Streaming speech-to-text with faster-whisper.

Whisper is not a streaming model, so partial transcripts come from re-decoding the growing utterance buffer
(in a worker thread) and committing only the words that two consecutive passes agree on (LocalAgreement-2,
as in ufal/whisper_streaming): committed words never change, so a partial is a prefix of the final. Long
utterances are trimmed at committed sentence ends so each pass stays short. At end of speech ``final``
re-decodes only the audio after the trim point, and not at all when the last pass already saw every sample
(the Listener runs one when the user pauses, so a turn that ends in that pause has its final for free).

The window: Whisper pads its input to a 30 s window, and the encoder's cost is that of the window whatever
the audio's length (tiny.en int8 on this 2-core CPU: most of a pass; the decoder's few tokens are the rest).
``stt.window_s = 0`` (the default) fits the window of a prompted pass to the audio, rounded up to whole
seconds with a margin and never under MIN_WINDOW_S (shorter windows make Whisper repeat itself): the encoder is
fed only that part of faster-whisper's padded features, so a 3 s question is encoded as 10 s, not 30, and the
pass at a pause takes about half the time (`python -m voice.bench.stt_accuracy --windows 30,0 --prompt pause`
measures both, WER included). A shortened window has three known faults, each checked after the pass: it may
run on past the speech ("... octopuses. Thanks for watching, see you next time, ..."), words that word timing
piles up at one instant after the speech, which are cut off (``cut_pile``), or more words than the audio can
hold, and the pass is then decoded again with the whole window (``ran_on``); it may write words over the quiet
after the speech, which are dropped (``drop_unheard_tail``); and it may write a short reply twice ("No...
No..."), and the copy is dropped (``once``). The whole window is not safe from the first two either: with
the pause pass's prompt it ran on after 3 of 168 varied-voice requests (WER .39 from those alone), so every
prompted pass gets the same checks. Only passes with a prompt are fitted: plain passes (the partials while
the user speaks, a final that needs its own pass, a whole-file transcription) and passes with hotwords keep
Whisper's window (``window_s`` says why).

One window per pass: with word timing, faster-whisper goes on from the last word's end with a new window, which
after a request holds only the pause, where Whisper invents a sign-off ("We'll see you in the next video"). A
pass stops reading segments once nothing but quiet follows the last word (``quiet_after``): the pause pass
over "Why is the sky blue?" took 0.14 s instead of 0.40 s, which with one core busy had outlasted max_silence.

Why ``final`` does not decode only the audio after the committed words: the cut loses the context Whisper
needs. What it must guarantee instead is that it never loses what was committed: the committed words are kept
verbatim and the last pass only adds what follows them. Hallucinations on silence ("Thanks for watching!") go.

Hotwords (``stt.hotwords``; by default the names and areas of ``mqtt.devices``, from voice.config.stt_hotwords):
faster-whisper puts them in front of every pass's prompt (before the initial prompt, so the pass at a pause gets
both; they are dropped only when a ``prefix`` is given, which this module never does). tiny.en heard "sprinkler"
as "spring clerk" and "tv socket" as "TB socket" until told the names. A pass with hotwords gets the whole window;
one that runs on past its audio is decoded again without them (``ran_on``), and its last words over quiet
audio are dropped (with a prompt Whisper sometimes goes on into the silence after the request: "... to on.
Music.").

Two beam sizes: ``stt.partial_beam_size`` for the passes while the user speaks (they only have to agree with
each other) and ``stt.beam_size`` for every pass that can become the final (at a pause, and the final's own).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from audio.frames import SPEECH_RATE
from voice.config import Config, STTConfig, stt_hotwords
from voice.hearing.whisper_faults import (
    Word,
    cut_pile,
    drop_goodbye,
    drop_unheard_tail,
    hallucinated,
    join_words,
    once,
    quiet_after,
    ran_on,
)
from voice.models import ModelError, Resolved, hub_error, resolve

log = logging.getLogger("specvoice.stt")

WHISPER_WINDOW_S = 30  # the window Whisper was trained on
MIN_WINDOW_S = 10  # a fitted window is never shorter: at 3-5 s Whisper repeats itself (voice.bench.stt_accuracy)
WINDOW_MARGIN_S = 0.5  # ... and leaves at least this much room after the audio
TOKENS_PER_S = 8  # Whisper writes about 4-5 tokens per second of fast speech: a pass may write this many
# Whisper's decoder holds 448 tokens, the prompt's included (the hotwords and the pass's own prompt): a pass over
# a long buffer (a turn that has committed nothing yet) asks for no more than this, which its 30 s window of
# speech never needs
MAX_NEW_TOKENS = 200
FRAMES_PER_S = 100  # Whisper's log-mel frames per second
_SILENT_PEAK = 0.003  # below this the buffer is not decoded at all
_TRIM_AFTER_S = 12.0  # trim the buffer at a committed sentence end once it is this long
_MAX_BUFFER_S = 25.0  # Whisper sees 30 s windows: trim at any committed word beyond this
_MIN_NEW_S = 0.2  # a partial pass needs at least this much new audio
_TAIL_RMS = 0.01  # about -40 dBFS: audio after the last pass this quiet needs no re-decode
_ALIGN_S = 0.6  # a new pass's copy of the last committed word lies within this of where it was heard


def hint_text(phrases: Sequence[str]) -> str | None:
    """stt.hotwords as Whisper's hint: "Kitchen light, Tv socket, Garden." Whisper writes in the style of what
    precedes the audio: measured on 24 spoken home requests (tiny.en), a lower-case list without a full stop
    made it drop capitals and stops and run on with more names ("light, light,", once looping "garage door"
    to the end of its context: WER 1.16 on 24 of them); capitalized phrases that end in a full stop did not
    (WER 0.22 on 48, 0.30 without the hint)."""
    return ", ".join(p[:1].upper() + p[1:] for p in phrases) + "." if phrases else None


@functools.cache
def _windowed_whisper() -> type:
    """The model class (faster-whisper is imported when the first local STT loads: a remote one never needs it)."""
    from faster_whisper import WhisperModel

    class WindowedWhisper(WhisperModel):
        """faster-whisper's model, its encoder fed only the first ``window_frames`` of each 30 s segment.
        faster-whisper pads every segment to 30 s of features; past the audio (and its margin) that is padding,
        and encoding it is most of a pass. CTranslate2's encoder takes the shorter input as it is."""

        window_frames: int | None = None

        def encode(self, features: Any) -> Any:
            if self.window_frames is not None and features.shape[-1] > self.window_frames:
                features = np.ascontiguousarray(features[..., : self.window_frames])
            return super().encode(features)

    return WindowedWhisper


class SpeechToText:
    """One loaded Whisper model (loaded once, shared by every utterance; decodes are serialized)."""

    def __init__(
        self,
        resolved: Resolved,
        settings: STTConfig,
        executor: Executor | None = None,
        hotwords: Sequence[str] | None = None,
    ) -> None:
        self.settings = settings
        # faster-whisper's hotwords: phrases put before every pass's prompt. ``hotwords`` (a caller with the whole
        # config passes voice.config.stt_hotwords, which fills the default from mqtt.devices), else stt.hotwords.
        self.hotwords = hint_text(hotwords if hotwords is not None else settings.hotwords or [])
        # the thread Whisper passes run on (the assistant owns it; standalone use gets its own)
        self.executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="specvoice-stt")
        try:
            self.model = _windowed_whisper()(
                str(resolved.path or resolved.hub_id),
                device=settings.device,
                compute_type=settings.compute_type,
                cpu_threads=settings.threads,
            )
        except Exception as exc:  # faster-whisper raises a mix of OSError/RuntimeError/hub errors
            if resolved.hub_id is not None:
                raise hub_error(resolved, exc) from None
            raise ModelError(
                f"cannot load Whisper model {resolved.location} ({exc}); fix: check stt.device and "
                f"stt.compute_type, or run `specvoice models verify`"
            ) from None
        self.language = settings.language
        if not self.model.model.is_multilingual and self.language not in (None, "en"):
            raise ModelError(
                f"STT model {resolved.name!r} is English-only but stt.language = {self.language!r}; "
                f"fix: set stt.language = 'en' or use a multilingual model (whisper-base)"
            )
        from faster_whisper.tokenizer import Tokenizer

        multilingual = self.model.model.is_multilingual  # ``fits`` writes texts as Whisper's tokens
        self._tokenizer = Tokenizer(self.model.hf_tokenizer, multilingual, "transcribe", self.language or "en")
        self._lock = threading.Lock()
        self.passes = 0  # decoder passes run, for benchmarks and tests
        self.decoded_s = 0.0  # audio seconds decoded

    @classmethod
    def from_config(cls, config: Config, executor: Executor | None = None) -> SpeechToText:
        """The recogniser a whole config asks for: models.stt, the stt settings, and the home's names as hotwords."""
        model = resolve(config.models.stt, "stt", config.models.cache_dir)
        return cls(model, config.stt, executor=executor, hotwords=stt_hotwords(config.stt, config.mqtt))

    def stream(self) -> StreamingTranscription:
        return StreamingTranscription(self)

    def decode(self, audio: np.ndarray, prompt: str | None = None, beam_size: int | None = None) -> list[Word]:
        """One Whisper pass over float32 16 kHz ``audio`` (blocking: call it from a worker thread).
        ``beam_size``: default ``stt.beam_size`` (the final's). A pass is checked for its known faults (module
        docstring): a run-on piled up after the speech is cut off; a fitted pass with more words than its audio
        holds is decoded again with the whole window; words over quiet audio after the speech, and a second
        copy of the whole text, are dropped."""
        if len(audio) == 0 or float(np.max(np.abs(audio))) < _SILENT_PEAK:
            return []
        audio_s = len(audio) / SPEECH_RATE
        with self._lock:
            window = self.window_s(len(audio), prompted=bool(prompt))
            words = cut_pile(self._decode(audio, window, prompt, beam_size, self.hotwords))
            if window < WHISPER_WINDOW_S and ran_on(words, audio_s):
                log.debug("fitted window ran on: whole window", extra={"text": join_words(words)})
                window = WHISPER_WINDOW_S
                words = cut_pile(self._decode(audio, window, prompt, beam_size, self.hotwords))
            if self.hotwords and ran_on(words, audio_s):
                log.debug("hinted pass ran on: decoded without the hotwords", extra={"text": join_words(words)})
                words = self._decode(audio, window, prompt, beam_size, None)
            if prompt or self.hotwords:  # the passes a fitted window or a hint can lead astray
                words = once(drop_goodbye(drop_unheard_tail(words, audio)))
            self.passes += 1
            self.decoded_s += audio_s
        return words

    def _decode(
        self, audio: np.ndarray, window_s: int, prompt: str | None, beam_size: int | None, hotwords: str | None
    ) -> list[Word]:
        self.model.window_frames = window_s * FRAMES_PER_S
        segments, _ = self.model.transcribe(
            audio,
            language=self.language,
            beam_size=beam_size or self.settings.beam_size,
            temperature=0.0,
            word_timestamps=True,
            condition_on_previous_text=False,
            # a run-on stops early
            max_new_tokens=min(MAX_NEW_TOKENS, math.ceil(TOKENS_PER_S * len(audio) / SPEECH_RATE) + 12),
            initial_prompt=prompt or None,
            hotwords=hotwords,
            vad_filter=False,
        )
        words: list[Word] = []
        for seg in segments:
            if hallucinated(seg, audio):
                log.debug("dropped hallucination", extra={"text": seg.text, "no_speech": seg.no_speech_prob})
                continue
            words += [Word(w.word, w.start, w.end) for w in seg.words or [] if Word(w.word, 0, 0).key]
            if words and quiet_after(audio, words[-1].end):
                break  # faster-whisper's next window would decode the pause alone (module docstring)
        return words

    def window_s(self, samples: int, prompted: bool = False) -> int:
        """Whisper's window for ``samples`` of audio: stt.window_s, or (0, the default) the audio's length rounded
        up with at least WINDOW_MARGIN_S to spare, never under MIN_WINDOW_S nor over Whisper's 30 s, for a pass
        with a prompt (the pass at a pause: WER .101 fitted, .107 whole, on the varied set). A plain pass keeps
        Whisper's 30 s: fitted it heard worse (.118 against .114; one- and two-word replies .298 against .244;
        in the test suite "and no can bread" for "Add milk and bread", a spoken reply written twice), and it is
        not what ends a turn. So does a pass with hotwords, whose hint weakens with the window ("Turn on the Hue
        Bloom" heard as "cube, Bloom" at 10 and 15 s, right at 20 and 30)."""
        if self.settings.window_s:
            return self.settings.window_s
        if self.hotwords or not prompted:
            return WHISPER_WINDOW_S
        return min(WHISPER_WINDOW_S, max(MIN_WINDOW_S, math.ceil(samples / SPEECH_RATE + WINDOW_MARGIN_S)))

    def fits(self, audio: np.ndarray, texts: Sequence[str]) -> list[float]:
        """How well float32 ``audio`` fits each of ``texts``: Whisper's mean log-probability per token, teacher-
        forced, as a closed grammar would score them (voice/dialog/rehearing.py chooses among them)."""
        from faster_whisper.audio import pad_or_trim

        model, tokenizer = self.model, self._tokenizer
        with self._lock:
            features = model.feature_extractor(audio)
            frames = min(features.shape[-1], WHISPER_WINDOW_S * FRAMES_PER_S)
            model.window_frames = None
            encoded = model.encode(pad_or_trim(features[:, : WHISPER_WINDOW_S * FRAMES_PER_S]))
            scores = []
            for text in texts:  # one at a time: a batch repeats the encoder's output and measured slower
                tokens = tokenizer.encode(" " + text.strip())
                aligned = model.model.align(encoded, tokenizer.sot_sequence, [tokens], frames)[0]
                scores.append(float(np.mean(np.log(np.maximum(aligned.text_token_probs, 1e-9)))))
        return scores

    async def run_decode(
        self, audio: np.ndarray, prompt: str | None = None, beam_size: int | None = None
    ) -> list[Word]:
        """``decode`` on the STT worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.decode, audio, prompt, beam_size)

    async def run_fits(self, audio: np.ndarray, texts: Sequence[str]) -> list[float]:
        """``fits`` on the STT worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.fits, audio, list(texts))

    async def transcribe(self, samples: np.ndarray) -> str:
        """Whole-utterance transcription (int16 16 kHz), one pass on the STT worker."""
        return join_words(await self.run_decode(samples.astype(np.float32) / 32768.0))


class StreamingTranscription:
    """One utterance: ``add`` audio as it arrives, ask for ``partial`` now and then, ``final`` at the end.

    ``committed`` is the agreed text (it only grows, and every later partial and the final start with it);
    ``tentative`` is the rest of the latest pass.
    """

    def __init__(self, stt: SpeechToText) -> None:
        self.stt = stt
        self._audio = np.zeros(0, dtype=np.float32)  # since the last trim
        self._offset_s = 0.0  # seconds trimmed off the front: buffer time + offset = time since the first sample
        self._done: list[str] = []  # text of trimmed (finished) sentences
        self._committed: list[Word] = []  # agreed words inside the current buffer
        self._previous: list[Word] | None = None  # last pass's words after the committed ones
        self._decoded_len = -1  # buffer length the last pass saw
        self.passes = 0
        self.final_decoded: bool | None = None  # did final() need its own pass (None: not called yet)

    def add(self, samples: np.ndarray) -> None:
        if samples.dtype != np.int16:
            raise ValueError(f"add() takes 16 kHz int16 samples (got {samples.dtype})")
        self._audio = np.concatenate([self._audio, samples.astype(np.float32) / 32768.0])

    @property
    def duration(self) -> float:
        return len(self._audio) / SPEECH_RATE

    @property
    def elapsed(self) -> float:
        """Seconds of audio added since the first sample (``duration`` plus what trimming dropped)."""
        return self._offset_s + self.duration

    @property
    def committed(self) -> str:
        return " ".join([*self._done, join_words(self._committed)]).strip()

    @property
    def tentative(self) -> str:
        return join_words(self._previous or [])

    @property
    def text(self) -> str:
        return " ".join(p for p in (*self._done, join_words(self._committed + (self._previous or []))) if p)

    def text_before(self, t: float) -> str:
        """The words of ``text`` that start before ``t`` seconds after the first sample: what the user said
        before a pause that began at ``t`` (Whisper sometimes ends a fragment with a word it invents in the
        silence that follows: "Set a timer for it.")."""
        cut = t - self._offset_s
        words = [w for w in self._committed + (self._previous or []) if w.start < cut]
        return " ".join(p for p in (*self._done, join_words(words)) if p)

    def _prompt(self, style: str | None = None) -> str | None:
        return " ".join(p for p in (style, " ".join(self._done)[-200:]) if p) or None

    async def _pass(self, style: str | None = None, beam_size: int | None = None) -> list[Word]:
        audio, prompt = self._audio, self._prompt(style)
        words = await self.stt.run_decode(audio, prompt, beam_size)
        self._decoded_len = len(audio)
        self.passes += 1
        return words

    def _after_committed(self, words: list[Word]) -> list[Word]:
        """The part of a new pass that follows the committed words: after them when the pass starts with the
        same words; else after the last place the pass repeats the committed words' ending (2 words, then
        1, near where they were heard); else by time. Never the committed words again, so nothing is doubled,
        and a pass that reads the start differently ("What's" for "What is") cannot drop the words after it."""
        n = len(self._committed)
        if n == 0:
            return words
        keys = [w.key for w in words]
        if keys[:n] == [w.key for w in self._committed]:
            return words[n:]
        last = self._committed[-1]
        for k in (2, 1):
            tail = [w.key for w in self._committed[-k:]]
            if len(tail) < k:
                continue
            found = [
                i
                for i in range(len(words) - k + 1)
                if keys[i : i + k] == tail and abs(words[i + k - 1].end - last.end) < _ALIGN_S
            ]
            if found:
                return words[found[-1] + k :]
        edge = last.end - 0.05
        return [w for w in words if w.start >= edge]

    async def partial(
        self, *, style: str | None = None, final_beam: bool = False, min_new_s: float = _MIN_NEW_S
    ) -> str | None:
        """Re-decode the buffer and return committed + tentative text; None when there is no new speech.

        ``style``: an initial prompt for this pass (audio.end_of_turn.TRANSCRIPT_PROMPT at a pause); ``final_beam``:
        decode with ``stt.beam_size`` (a pass at a pause becomes the final when the turn ends there), else
        ``stt.partial_beam_size``; ``min_new_s``: skip the pass with less new audio than this."""
        new_s = (len(self._audio) - max(self._decoded_len, 0)) / SPEECH_RATE
        if new_s <= 0 or new_s < min_new_s or self.nothing_new():
            return None  # too little new audio, or only silence since the last pass: decoding it changes nothing
        beam = None if final_beam else self.stt.settings.partial_beam_size
        new = self._after_committed(await self._pass(style, beam))
        if self._previous is not None:
            agree = 0
            while agree < min(len(new), len(self._previous)) and new[agree].key == self._previous[agree].key:
                agree += 1
            self._committed += new[:agree]
            new = new[agree:]
        self._previous = new
        self._trim()
        return self.text

    def _trim(self) -> None:
        """Cut the buffer after a committed sentence end so later passes decode less."""
        seconds = len(self._audio) / SPEECH_RATE
        if seconds < _TRIM_AFTER_S or not self._committed:
            return
        ends = [i for i, w in enumerate(self._committed) if w.text.rstrip().endswith((".", "?", "!"))]
        if ends:
            cut = ends[-1]
        elif seconds >= _MAX_BUFFER_S:
            cut = len(self._committed) - 1
        else:
            return
        cut_s = self._committed[cut].end
        self._done.append(join_words(self._committed[: cut + 1]))
        shift = lambda ws: [replace(w, start=w.start - cut_s, end=w.end - cut_s) for w in ws]  # noqa: E731
        self._committed = shift(self._committed[cut + 1 :])
        self._previous = shift(self._previous or [])
        self._audio = self._audio[int(cut_s * SPEECH_RATE) :]
        self._offset_s += int(cut_s * SPEECH_RATE) / SPEECH_RATE
        self._decoded_len = -1
        log.debug("trimmed stt buffer", extra={"at_s": cut_s})

    def nothing_new(self) -> bool:
        """True when the last pass saw all the speech: no new audio, or only quiet audio (the endpointing
        silence the VAD waited for) since then."""
        if self._decoded_len < 0:
            return False
        tail = self._audio[self._decoded_len :]
        return len(tail) == 0 or float(np.sqrt(np.mean(np.square(tail)))) < _TAIL_RMS

    async def fits(self, texts: Sequence[str]) -> list[float] | None:
        """How well this utterance's audio fits each of ``texts`` (``SpeechToText.fits``); None for a long
        utterance, trimmed, whose audio is no longer all here."""
        if self._done or not len(self._audio) or not texts:
            return None
        return await self.stt.run_fits(self._audio, texts)

    async def final(self) -> str:
        """The final transcript: committed words plus the rest of a last pass (skipped if nothing is new).
        It always starts with the committed text: a pass can add words after it, never take them back."""
        committed = self.committed
        self.final_decoded = not self.nothing_new()
        if self.final_decoded:
            self._previous = self._after_committed(await self._pass())
        text = self.text
        if not text.startswith(committed):  # cannot happen by construction; the guarantee is kept explicit
            log.warning("final lost committed words", extra={"committed": committed, "final": text})
            text = committed
        return text
