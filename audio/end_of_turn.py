"""Semantic end of turn: has the user finished, judged from how the last seconds of their voice sound.

A silence rule alone must choose between cutting people off at a mid-sentence pause ("Set a timer for ...
ten minutes") and making every answer wait out a long silence. Smart Turn v3.2 (a small Whisper-encoder
classifier from the pipecat project, BSD-2-Clause, 8.7 MB int8 onnx) hears intonation and the words so far
and returns P(the turn is complete). The policy here asks it once a short silence has passed and ends the
turn at once when it says complete; otherwise it keeps listening up to a longer silence limit.

Two pieces, so the Listener can run the model off the event loop and tests can drive the rule without it:
  - ``SmartTurn``: the model. ``probability(audio)`` takes 16 kHz int16 audio of the current turn (its last
    8 s are used; shorter audio is zero-padded in front, as the model was trained), computes Whisper-style
    log-mel features (80 mels, 25 ms Hann window, 10 ms hop, 8 s chunk: shape 80 x 800) in numpy, and runs
    the onnx graph. Blocking: call it from a worker thread.
  - ``EndOfTurnPolicy``: a pure state machine on one clock. Feed it the VAD's verdict for each block
    (``observe``); it answers WAIT, ASK (run the model on the audio up to now, then hand the probability to
    ``verdict``) or END. With ``engine = "vad"`` or no model it is today's rule: END after
    ``vad_silence_ms`` of silence.
On synthetic speech the model alone calls many unfinished requests complete ("Turn on the" spoken as a
sentence falls in pitch like a finished one), so ``verdict`` also takes the transcript of the audio so far
when the caller has it (the STT's pass at the pause, decoded with ``TRANSCRIPT_PROMPT``; the final transcript
can reuse it): a request that ends on an article, a conjunction or a preposition ("for", "the", "and"), or
that Whisper wrote as trailing off ("..."), is not finished whatever it sounds like.
Measured (voice.bench.stt_accuracy, this 2-core CPU, 108 paused and 108 complete synthetic requests): the
VAD-only 500 ms rule cuts 60% of the paused requests; Smart Turn alone 65% (it also cuts 0.4 s pauses), but
ends complete ones 200 ms sooner; with the transcript check 0-5% on this CPU, where the check's Whisper
pass (~0.6 s) lands after most pauses have ended, and 22% if every answer came at once.
Never imports ``voice``.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from audio.frames import SPEECH_RATE

WINDOW_S = 8  # the model sees the last 8 s of the turn
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 80
_FRAMES = WINDOW_S * SPEECH_RATE // HOP  # 800


# ---- features ------------------------------------------------------------------------------------------------


def _hz_to_mel(hz: float | np.ndarray) -> np.ndarray:
    """Slaney's mel scale (Whisper's): linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    step = np.log(6.4) / 27.0
    return np.where(hz < 1000.0, hz * 3.0 / 200.0, 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) / step)


def _mel_to_hz(mel: float | np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    step = np.log(6.4) / 27.0
    return np.where(mel < 15.0, mel * 200.0 / 3.0, 1000.0 * np.exp((mel - 15.0) * step))


@functools.cache
def mel_filterbank(n_mels: int = N_MELS, n_fft: int = N_FFT, rate: int = SPEECH_RATE) -> np.ndarray:
    """Triangular filters evenly spaced on the mel scale from 0 Hz to Nyquist, each scaled to unit area
    ("Slaney" normalisation); shape (n_mels, n_fft // 2 + 1)."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(rate / 2), n_mels + 2))
    bins = np.linspace(0.0, rate / 2, n_fft // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lo) / (mid - lo)
    falling = (hi - bins[None, :]) / (hi - mid)
    return np.clip(np.minimum(rising, falling), 0.0, None) * (2.0 / (hi - lo))


@functools.cache
def _hann() -> np.ndarray:
    """Periodic Hann window (the DFT-even form Whisper uses, not numpy's symmetric one)."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)


def model_window(audio: np.ndarray) -> np.ndarray:
    """The model's input audio: float32 in [-1, 1), exactly ``WINDOW_S`` seconds, the end of ``audio`` kept
    and zero padding in front when it is shorter (the end of the turn must sit at the end of the window)."""
    x = audio.astype(np.float32) / 32768.0 if audio.dtype == np.int16 else np.asarray(audio, dtype=np.float32)
    n = WINDOW_S * SPEECH_RATE
    if len(x) >= n:
        return x[-n:]
    return np.concatenate([np.zeros(n - len(x), dtype=np.float32), x])


def log_mel(window: np.ndarray) -> np.ndarray:
    """Whisper log-mel features of an 8 s float window, shape (80, 800), float32.

    Steps as Whisper's feature extractor with ``do_normalize``: the waveform is scaled to zero mean and unit
    variance, framed with centred (reflect-padded) 25 ms periodic-Hann windows every 10 ms, power spectrum,
    mel filters, log10 floored at 1e-10, the trailing frame dropped, values clamped to 8 below the maximum
    (an 80 dB range) and mapped by (x + 4) / 4.
    """
    if window.shape != (WINDOW_S * SPEECH_RATE,):
        raise ValueError(
            f"log_mel takes exactly {WINDOW_S * SPEECH_RATE} samples (got {window.shape}); "
            f"fix: pass model_window(audio)"
        )
    x = window.astype(np.float32)
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]  # (801, 400), no copy
    power = np.abs(np.fft.rfft(frames * _hann(), axis=1)) ** 2  # (801, 201)
    mel = mel_filterbank() @ power[:-1].T  # (80, 800)
    logs = np.log10(np.maximum(mel, 1e-10))
    logs = np.maximum(logs, logs.max() - 8.0)
    return ((logs + 4.0) / 4.0).astype(np.float32)


# ---- the model -----------------------------------------------------------------------------------------------


class SmartTurn:
    """Smart Turn v3.x onnx: P(the speaker has finished their turn) from the audio of the turn so far."""

    def __init__(self, model_path: str | Path, threads: int = 1) -> None:
        """``model_path``: the .onnx file, or the folder holding it (``resolve("smart-turn-v3.2", "turn").path``).
        ``threads``: onnxruntime intra-op threads (1 or 2; measured in voice.bench.stt_accuracy)."""
        import onnxruntime as ort

        path = Path(model_path)
        if path.is_dir():  # a prepared cache folder: the one onnx inside it
            found = sorted(path.glob("*.onnx"))
            path = found[0] if len(found) == 1 else path / "(no single .onnx)"
        if not path.is_file():
            raise FileNotFoundError(
                f"Smart Turn model {path} not found; fix: `specvoice models prepare "
                f"smart-turn-v3.2`, or set turn.engine = 'vad'"
            )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # idle worker threads must sleep, not spin: the STT and the LLM share these cores
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        self._input = self.session.get_inputs()[0].name
        shape = self.session.get_inputs()[0].shape
        if list(shape[1:]) != [N_MELS, _FRAMES]:
            raise ValueError(f"{path} takes input {shape}, not (batch, {N_MELS}, {_FRAMES}); is it Smart Turn v3?")
        self.path = path

    def probability(self, audio: np.ndarray) -> float:
        """P(complete) for the turn whose audio (16 kHz, int16 or float in [-1, 1]) ends with ``audio``'s last
        sample. Pass the turn from just before its speech start (the VAD's pre-roll) up to now, trailing
        silence included; only the last 8 s count. Blocking, a few tens of ms on a CPU core."""
        features = log_mel(model_window(audio))[None]
        (out,) = self.session.run(None, {self._input: features})
        return float(np.asarray(out).reshape(-1)[0])  # the graph ends in a sigmoid


# ---- the transcript check ------------------------------------------------------------------------------------

# Words a finished English request practically never ends on. Particles that end commands ("turn it on",
# "switch it off") and pronouns ("call her") are left out. A word here makes the policy wait for the silence
# limit, which is the safe side; Whisper adds a "?" to many unfinished questions ("What is the weather like
# in?"), so a question mark does not clear a dangling word.
DANGLING_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "my",
        "your",
        "our",
        "their",
        "his",
        "its",
        "some",
        "any",
        "every",
        "each",
        "no",
        "and",
        "or",
        "but",
        "nor",
        "because",
        "if",
        "unless",
        "although",
        "though",
        "whether",
        "than",
        "to",
        "for",
        "of",
        "with",
        "from",
        "at",
        "by",
        "in",
        "about",
        "into",
        "onto",
        "upon",
        "toward",
        "towards",
        "between",
        "without",
        "within",
        "during",
        "like",
        "um",
        "uh",
        "er",
        "erm",
    ]
)
# Verbs that, followed by "me" and nothing else, still lack what they ask for ("tell me ... how far the moon is").
WANTS_AN_OBJECT = frozenset(["tell", "show", "give", "remind", "let", "bring", "get", "find", "send"])
_TRAILING_OFF = ("...", "\u2026", ",", "-", "\u2014", ":", ";")
# Whisper's initial prompt for the pass whose text goes to verdict(). Unprompted, Whisper "finishes" a
# fragment with a word it half-hears or invents ("Turn on the" -> "Turn on that.", "Set a timer for it.");
# a prompt of trailing-off requests makes it write what was said ("Turn on the..."). Measured on the paused
# set with tiny.en: unfinished halves recognised 80/108 instead of 54/108, complete requests misread as
# unfinished 1/108 (0/108 unprompted), word error rate on complete requests 0.111 (0.123 unprompted).
TRANSCRIPT_PROMPT = "Open the... Remind me to... Add eggs and..."


def transcript_unfinished(text: str) -> bool:
    """True when ``text`` reads as cut short: it ends on a word in ``DANGLING_WORDS``, or with a trailing
    "...", a comma or a dash (Whisper writes "Set a timer for..." for an unfinished request). Empty text
    tells nothing (False). Pass only the words heard before the pause: Whisper sometimes ends a fragment
    with a word it invents in the silence ("Set a timer for it."). One word with dots ("Yes...", "Stop...") is
    an answer: the pause prompt makes Whisper write most one-word replies so (tiny.en, a fitted window: 116 of
    140 one- and two-word replies in 14 voices read as unfinished, 36 with this rule; the unfinished halves of
    the paused set kept 98 of 108)."""
    stripped = text.strip()
    if not stripped:
        return False
    words = re.findall(r"[a-z']+", stripped.lower())
    if stripped.endswith(("...", "\u2026")) and len(words) == 1:
        return words[0] in DANGLING_WORDS
    if len(words) >= 2 and words[-1] == "me" and words[-2] in WANTS_AN_OBJECT:
        return True  # "Can you tell me?": Whisper's question mark, the request's object still to come
    return stripped.endswith(_TRAILING_OFF) or bool(words) and words[-1] in DANGLING_WORDS


# ---- the endpointing policy ----------------------------------------------------------------------------------

_EPS_MS = 1e-3


class TurnAction(enum.Enum):
    WAIT = "wait"  # keep listening
    ASK = "ask"  # run SmartTurn on the audio up to now, then call verdict(step.ask_id, probability, t)
    END = "end"  # the turn is over: finalize the transcript and reply


@dataclass(frozen=True)
class TurnStep:
    action: TurnAction
    silence_s: float = 0.0  # length of the current pause at this step
    reason: str = ""  # END: "complete" (the model), "max_silence", "vad_silence" (the VAD-only rule);
    #                   WAIT from verdict(): "incomplete" (the model) or "unfinished_text" (the transcript)
    ask_id: int = 0  # ASK: hand it back to verdict(), which ignores answers about a pause that has ended
    probability: float | None = None  # END "complete" or a WAIT from verdict(): what the model said


@dataclass(frozen=True)
class TurnSettings:
    """Plain values (``audio`` does not import the config); the ``[turn]`` config section maps onto them.
    Defaults chosen from the measurements above: a higher threshold trades complete turns that wait for
    ``max_silence_ms`` for fewer cuts (0.9: 82 of 108 complete ended by the model instead of 99), and asking
    again later only adds cuts (the model says "complete" more often the longer the silence)."""

    engine: Literal["smart", "vad"] = "smart"
    threshold: float = 0.5  # P(complete) at or above which the turn ends
    min_silence_ms: int = 200  # ask the model after this much silence
    max_silence_ms: int = 1000  # end the turn after this much silence whatever the model says
    reask_ms: int = 0  # after an "incomplete", ask again each time the pause has grown by this (0: never)
    vad_silence_ms: int = 500  # the VAD-only rule (vad.end_silence_ms): used when engine = "vad" or no model
    use_transcript: bool = True  # a transcript given to verdict() that reads unfinished vetoes "complete"

    def __post_init__(self) -> None:
        if self.engine not in ("smart", "vad"):
            raise ValueError(f"turn engine {self.engine!r}: use 'smart' or 'vad'")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"turn threshold {self.threshold} must lie in (0, 1)")
        if not 0 < self.min_silence_ms <= self.max_silence_ms:
            raise ValueError(
                f"turn silences: need 0 < min_silence_ms ({self.min_silence_ms}) <= max_silence_ms "
                f"({self.max_silence_ms})"
            )
        if self.reask_ms < 0 or self.vad_silence_ms <= 0:
            raise ValueError("turn reask_ms must be >= 0 and vad_silence_ms > 0")


@dataclass
class EndOfTurnPolicy:
    """When is the user's turn over? Pure: no clock, no model, no audio; the caller supplies all three.

    Drive it with every VAD decision, in stream order, on the stream's clock:
        step = policy.observe(t, speech)          # t: end time of the block/window just classified
        if step.action is TurnAction.ASK:         # then, in a worker thread:
            p = smart_turn.probability(turn_audio_up_to_t)
            step = policy.verdict(step.ask_id, p, t_when_the_answer_came, transcript_so_far)
        if step.action is TurnAction.END: ...     # the turn ends; the policy waits for new speech
    Keep calling ``observe`` while the model runs: new speech makes its answer stale (``verdict`` ignores
    it), and ``max_silence_ms`` still ends the turn if the model is slow. Only one ASK is out at a time.
    ``model_ready=False`` (no model file, or it failed to load) falls back to the VAD-only rule.
    """

    settings: TurnSettings = field(default_factory=TurnSettings)
    model_ready: bool = True
    _armed: bool = field(default=False, init=False)  # speech heard since the last END
    _last_voiced: float | None = field(default=None, init=False)
    _pause_start: float | None = field(default=None, init=False)
    _ask_id: int = field(default=0, init=False)
    _asking: bool = field(default=False, init=False)  # an ASK is out, no verdict yet
    _asked_at_s: float | None = field(default=None, init=False)  # silence length at the last ASK of this pause
    asks: int = field(default=0, init=False)  # model calls requested (for traces and benchmarks)
    last_probability: float | None = field(default=None, init=False)

    @property
    def engine(self) -> Literal["smart", "vad"]:
        """The rule actually in force: "vad" when configured so or when the model is missing."""
        return "smart" if self.settings.engine == "smart" and self.model_ready else "vad"

    @property
    def pause_start(self) -> float | None:
        """Start of the current silence inside a turn (None while voiced or between turns)."""
        return self._pause_start if self._armed else None

    def reset(self) -> None:
        """Forget the turn (a new stream, or the pipeline ended the turn some other way)."""
        self._armed, self._last_voiced, self._pause_start = False, None, None
        self._new_pause()

    def _new_pause(self) -> None:
        self._ask_id += 1  # any answer still on its way is now about an old pause
        self._asking, self._asked_at_s = False, None

    def observe(self, t: float, speech: bool, pause_start: float | None = None) -> TurnStep:
        """One VAD decision: ``speech`` for the block that ends at ``t``. ``pause_start`` (optional) is the
        VAD's own start of the current silence (``Vad.pause_since``); otherwise the pause starts at the end
        of the last voiced block."""
        if speech:
            if self._pause_start is not None:
                self._new_pause()
            self._armed, self._last_voiced, self._pause_start = True, t, None
            return TurnStep(TurnAction.WAIT)
        if not self._armed:
            return TurnStep(TurnAction.WAIT)  # silence before the turn started, or after it ended
        if self._pause_start is None:
            start = pause_start if pause_start is not None else self._last_voiced
            self._pause_start = min(t, start if start is not None else t)
        silence = t - self._pause_start
        s = self.settings
        ms = silence * 1000 + _EPS_MS  # block times are sums of floats: 0.2 s must count as 200 ms
        if self.engine == "vad":
            return self._end(silence, "vad_silence") if ms >= s.vad_silence_ms else TurnStep(TurnAction.WAIT, silence)
        if ms >= s.max_silence_ms:
            return self._end(silence, "max_silence")
        if self._asking or ms < s.min_silence_ms:
            return TurnStep(TurnAction.WAIT, silence)
        if self._asked_at_s is not None and (s.reask_ms == 0 or ms - self._asked_at_s * 1000 < s.reask_ms):
            return TurnStep(TurnAction.WAIT, silence)
        self._asking, self._asked_at_s = True, silence
        self.asks += 1
        return TurnStep(TurnAction.ASK, silence, ask_id=self._ask_id)

    def verdict(self, ask_id: int, probability: float, t: float, transcript: str | None = None) -> TurnStep:
        """The model's answer to the ASK with ``ask_id``, arriving at ``t``: END when it says complete and
        ``transcript`` (the words heard up to the ASK, if the caller has them) does not read unfinished."""
        if ask_id != self._ask_id or not self._armed or self._pause_start is None:
            return TurnStep(TurnAction.WAIT)  # the user spoke again (or the turn ended) meanwhile
        self._asking = False
        self.last_probability = probability
        silence = max(0.0, t - self._pause_start)
        if probability < self.settings.threshold:
            return TurnStep(TurnAction.WAIT, silence, "incomplete", probability=probability)
        if self.settings.use_transcript and transcript is not None and transcript_unfinished(transcript):
            return TurnStep(TurnAction.WAIT, silence, "unfinished_text", probability=probability)
        return self._end(silence, "complete", probability)

    def _end(self, silence: float, reason: str, probability: float | None = None) -> TurnStep:
        self._armed, self._pause_start = False, None
        self._new_pause()
        return TurnStep(TurnAction.END, silence, reason, probability=probability)
