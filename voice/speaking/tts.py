"""Incremental text-to-speech with piper: one text fragment in, int16 PCM chunks out as an async stream.

Piper synthesizes a sentence at a time and cannot stop in the middle of one, so the caller keeps fragments
short (voice.speaking.chunker) and cancellation happens between piper's sentence chunks: closing or cancelling the
stream sets a flag the worker thread checks before it starts the next one.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from voice.config import TTSConfig
from voice.models import ModelError, Resolved


class TextToSpeech:
    """A loaded piper voice (a ``voice.ports.SpeechSynthesizer``). ``sample_rate`` is the voice's rate (22050 Hz for
    joe-medium)."""

    def __init__(self, resolved_voice: Resolved, settings: TTSConfig, executor: Executor | None = None) -> None:
        from piper import PiperVoice, SynthesisConfig

        if resolved_voice.path is None:
            raise ModelError(
                f"TTS voice {resolved_voice.name!r} must be a local piper .onnx file (hub voices are "
                f"not fetched); fix: set models.tts = 'piper-joe-medium' or a path to a .onnx voice"
            )
        path = Path(resolved_voice.path)
        config = Path(str(path) + ".json")
        if not config.exists():
            raise ModelError(
                f"piper voice {path} has no {config.name} beside it; fix: put the voice's .onnx.json "
                f"next to the .onnx file"
            )
        # our own onnxruntime session rather than PiperVoice.load's: piper's keeps its idle threads spinning, and
        # while we speak the LLM is still generating on the same cores, so synthesis gets threads that sleep
        import onnxruntime
        from piper.config import PiperConfig

        try:
            voice_config = PiperConfig.from_dict(json.loads(config.read_text()))
        except (ValueError, KeyError) as exc:
            raise ModelError(
                f"piper voice config {config} is unreadable ({type(exc).__name__}: {exc}); fix: "
                f"restore the voice's .onnx.json (`specvoice models verify --repair`)"
            ) from None
        options = onnxruntime.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        session = onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        self.voice = PiperVoice(session=session, config=voice_config)
        self.sample_rate: int = self.voice.config.sample_rate
        # the voice's language as its .onnx.json says (e.g. "en_US"); what Wyoming and Home Assistant are told
        self.language: str = _voice_language(json.loads(config.read_text()))
        self.syn_config = SynthesisConfig(
            speaker_id=settings.speaker_id,
            length_scale=settings.length_scale,
            noise_scale=settings.noise_scale,
            noise_w_scale=settings.noise_w_scale,
        )
        self._lock = threading.Lock()  # one onnxruntime session: one synthesis at a time
        # the thread syntheses run on (the assistant owns it; standalone use gets its own)
        self.executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="specvoice-tts")
        self.chunks_made = 0  # piper sentence chunks synthesized (cancellation is visible in this count)

    def synthesize(self, text: str, stop: threading.Event | None = None):
        """Blocking generator of int16 chunks (one per piper sentence); stops early when ``stop`` is set."""
        with self._lock:
            for chunk in self.voice.synthesize(text, self.syn_config):
                self.chunks_made += 1
                if stop is not None and stop.is_set():
                    return
                yield chunk.audio_int16_array

    async def stream(self, fragment: str) -> AsyncIterator[np.ndarray]:
        """Synthesize ``fragment`` in a worker thread and yield its PCM chunks as they are ready."""
        if not fragment.strip():
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[np.ndarray | BaseException | None] = asyncio.Queue()
        stop = threading.Event()

        def work() -> None:
            try:
                for pcm in self.synthesize(fragment, stop):
                    loop.call_soon_threadsafe(queue.put_nowait, pcm)
            except BaseException as exc:  # hand the error to the consumer instead of losing it in the thread
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        worker = loop.run_in_executor(self.executor, work)
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()  # cancelled or closed early: the worker stops before its next sentence
            worker.add_done_callback(lambda f: f.exception())  # never an "exception never retrieved" warning


def _voice_language(voice_json: dict) -> str:
    """The language code of a piper voice config: ``language.code`` (e.g. "en_US"), else ``espeak.voice``."""
    language = voice_json.get("language") or {}
    code = language.get("code") if isinstance(language, dict) else None
    if not code:
        code = (voice_json.get("espeak") or {}).get("voice", "")
    return str(code or "und")
