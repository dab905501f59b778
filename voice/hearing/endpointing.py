"""The semantic end of turn inside the Listener: Smart Turn on its own thread, the pause's transcript from the
STT pass at the pause, and ``audio.end_of_turn.EndOfTurnPolicy`` deciding from both.

``audio.end_of_turn`` has the pieces (the model, the pure policy); this module runs them against a live stream
without blocking it. Per 20 ms block the Listener calls ``observe`` with the VAD's verdict; when the policy
asks (after ``turn.min_silence_ms`` of silence), Smart Turn runs on the last 8 s of the turn in the turn
worker, while the Whisper pass that started at the pause runs in the STT worker. The answers surface at the
next block (``poll``): "incomplete" is a verdict at once (the transcript can only veto "complete"); "complete"
waits for the pause's transcript, which vetoes it when it trails off ("Set a timer for..."). Speech makes
every answer about the old pause stale; ``turn.max_silence_ms`` ends the turn whatever is still running.

Why Smart Turn gets its own thread and not the STT worker's: when it is asked, the STT worker is busy with the
pause's Whisper pass (0.4-0.7 s on this CPU), and Smart Turn queued behind it would answer "incomplete" only
after that pass, too late for the early reply it allows; on its own thread its ~50 ms (1 onnxruntime thread)
overlap the pass.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from audio.end_of_turn import WINDOW_S, EndOfTurnPolicy, SmartTurn, TurnAction, TurnSettings, TurnStep
from audio.frames import SPEECH_RATE
from voice.tasks import start

log = logging.getLogger("specvoice.endpointing")


@dataclass
class TurnModel:
    """Smart Turn and the thread it runs on: one per assistant, shared by every Listener (calls are tens of ms)."""

    model: SmartTurn
    executor: Executor

    @classmethod
    def load(cls, config: Any, executor: Executor | None = None, path: str | None = None) -> TurnModel | None:
        """The model ``config.models.turn`` names, or None when ``turn.engine = 'vad'`` or the model cannot be
        loaded (logged as a warning; turns then end by the VAD rule, ``vad.end_silence_ms``)."""
        if config.turn.engine != "smart":
            return None
        try:
            if path is None:
                from voice.models import resolve

                path = str(resolve(config.models.turn, "turn", config.models.cache_dir).path)
            model = SmartTurn(path, threads=config.turn.threads)
        except Exception as exc:  # a missing or broken model must not stop the assistant: the VAD rule still works
            log.warning(
                "Smart Turn unavailable, turns end by the VAD rule",
                extra={"error": str(exc), "fix": "specvoice models prepare smart-turn-v3.2"},
            )
            return None
        return cls(model, executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="specvoice-turn"))

    async def probability(self, audio: np.ndarray) -> float:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.model.probability, audio)


def turn_settings(config: Any) -> TurnSettings:
    """The ``[turn]`` section as the policy's settings (the VAD-only rule is ``vad.end_silence_ms``)."""
    return TurnSettings(**config.turn.model_dump(exclude={"threads"}), vad_silence_ms=config.vad.end_silence_ms)


class SemanticEnd:
    """One Listener's end-of-turn state: the policy, the Smart Turn call in flight, the pause's transcript.

    The Listener calls ``start_turn`` when an utterance opens, ``add`` with every block of it, ``observe`` once
    per block, ``transcript`` when the pass at the current pause is in, and ``poll`` to combine answers."""

    def __init__(self, settings: TurnSettings, model: TurnModel) -> None:
        self.policy = EndOfTurnPolicy(settings, model_ready=True)
        self.model = model
        self._chunks: list[np.ndarray] = []  # the turn's last WINDOW_S seconds (what Smart Turn hears)
        self._held = 0
        self._probe: tuple[int, asyncio.Future[float]] | None = None  # (ask id, Smart Turn call)
        self._probability: tuple[int, float] | None = None  # an answer waiting for the transcript
        self._text: str | None = None  # the words before the current pause, once its pass is in
        self.last: TurnStep | None = None  # the step that ended the last turn (for traces and benchmarks)

    @property
    def settings(self) -> TurnSettings:
        return self.policy.settings

    def start_turn(self, preroll: np.ndarray) -> None:
        self.policy.reset()
        self._chunks, self._held = [], 0
        self._new_pause()
        self.add(preroll)

    def _new_pause(self) -> None:
        self._probability, self._text = None, None

    def add(self, samples: np.ndarray) -> None:
        if not len(samples):
            return
        self._chunks.append(samples)
        self._held += len(samples)
        limit = WINDOW_S * SPEECH_RATE
        while self._held - len(self._chunks[0]) >= limit:
            self._held -= len(self._chunks.pop(0))

    def observe(self, t: float, speech: bool, pause_start: float | None) -> TurnStep:
        """The VAD's verdict for the block ending at ``t``; an ASK starts Smart Turn here."""
        was_paused = self.policy.pause_start is not None
        step = self.policy.observe(t, speech, pause_start)
        if speech and was_paused:
            self._new_pause()  # the user goes on: what was heard about that pause no longer counts
        if step.action is TurnAction.ASK:
            self._probability = None
            audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
            self._probe = (step.ask_id, start(self.model.probability(audio), name="smart turn"))
        return step

    def transcript(self, text: str) -> None:
        """What the pass at the current pause heard before it (``Transcription.text_before``)."""
        if self.policy.pause_start is not None:
            self._text = text

    @property
    def in_flight(self) -> asyncio.Future[float] | None:
        """The Smart Turn call still running, if any."""
        return self._probe[1] if self._probe is not None and not self._probe[1].done() else None

    @property
    def has_transcript(self) -> bool:
        return self._text is not None

    def poll(self, t: float) -> TurnStep | None:
        """Hand the policy what came in since the last block; a WAIT or END verdict, or None (nothing new)."""
        if self._probe is not None and self._probe[1].done():
            ask_id, future = self._probe
            self._probe = None
            try:
                self._probability = (ask_id, future.result())
            except Exception as exc:  # the VAD's max silence still ends the turn
                log.warning("Smart Turn failed", extra={"error": repr(exc)})
        if self._probability is None:
            return None
        ask_id, p = self._probability
        if p >= self.settings.threshold and self.settings.use_transcript and self._text is None:
            return None  # "complete" needs the transcript's word: wait for the pause's pass
        self._probability = None
        return self.policy.verdict(ask_id, p, t, self._text if self.settings.use_transcript else None)

    async def close(self) -> None:
        """Wait for a Smart Turn call still running (it cannot be cut)."""
        if self._probe is not None:
            await asyncio.wait({self._probe[1]})
            self._probe = None
