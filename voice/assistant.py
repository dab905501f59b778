"""The assistant: every model loaded once, the threads they run on, and the sessions that share them.

One place owns the model work's scheduling, so nothing queues behind anything else by accident:
- the LLM runs on the engine's own worker thread (llm/engine.py), one step at a time, and whole generations
  take turns first come first served (``generation_lock``): on a CPU, interleaving the steps of eight replies
  makes all eight late instead of one;
- Whisper passes run on the STT worker and piper syntheses on the TTS worker, one thread each, never in Python's
  default pool (where a burst of one could starve the other);
- Smart Turn (the semantic end of turn, ~50 ms a call) runs on its own thread: when it is asked, the STT
  worker is busy with the pause's Whisper pass, and the answer must not wait for it;
- VAD, wake word and echo cancelling are cheap (well under a millisecond per block) and run on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from llm.settings import DecodeSettings
from voice.config import Config
from voice.dialog.home import Home
from voice.dialog.session import Session
from voice.events import Event, EventHandler
from voice.hearing.endpointing import TurnModel
from voice.hearing.listener import Listener
from voice.hearing.parts import wake_word
from voice.hearing.wake import WakePhrase
from voice.latency import LatencyStats
from voice.memory import Trimmer
from voice.ports import AudioSink, ChatEngine, SpeechRecognizer, SpeechSynthesizer
from voice.tasks import Job, Tasks

log = logging.getLogger("specvoice.assistant")


class Assistant:
    """Every model, loaded once; many sessions share it."""

    def __init__(
        self,
        config: Config,
        engine: ChatEngine,
        stt: SpeechRecognizer,
        tts: SpeechSynthesizer,
        vad_path: str,
        wake_dir: str | None = None,
        workers: dict[str, ThreadPoolExecutor] | None = None,
        turn_model: TurnModel | None = None,
    ) -> None:
        self.config = config
        self.engine: ChatEngine = engine
        self.stt: SpeechRecognizer = stt
        self.tts: SpeechSynthesizer = tts
        self.vad_path, self.wake_dir = vad_path, wake_dir
        self.workers = workers or {}
        if "turn" not in self.workers:  # built from parts (tests): load Smart Turn here, if the config wants it
            self.workers["turn"] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specvoice-turn")
            turn_model = TurnModel.load(config, self.workers["turn"])
        self.turn_model = turn_model  # None: turns end by the VAD rule
        self.tts_sample_rate: int = tts.sample_rate
        self.stats = LatencyStats()
        self._turn_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._listeners: list[Callable[[str, Event], None]] = []
        self._sessions: set[Session] = set()
        self._background = Tasks()
        self.home = Home.from_config(
            config.mqtt, config.stt.language or "en"
        )  # named devices and their state, shared by every session
        self.memory = Trimmer()  # a closed session's memory goes back soon after (voice/memory.py)

    @classmethod
    async def load(cls, config: Config) -> Assistant:
        return await asyncio.to_thread(cls.load_sync, config)

    @classmethod
    def load_sync(cls, config: Config) -> Assistant:
        from llm.load import load_engine
        from voice.hearing.stt import SpeechToText
        from voice.models import resolve
        from voice.remote.llm import remote_backends
        from voice.speaking.tts import TextToSpeech

        m, llm = config.models, config.llm
        started = time.monotonic()
        remote = remote_backends(config)  # the ones the config puts on other machines; None: local
        engine: ChatEngine | None = remote.engine
        stt: SpeechRecognizer | None = remote.stt
        tts: SpeechSynthesizer | None = remote.tts
        draft = None
        if engine is None:
            target = resolve(m.target, "llm", m.cache_dir, engine=llm.engine).location
            if m.draft and llm.mode == "draft":
                draft = resolve(m.draft, "llm", m.cache_dir, engine=llm.engine).location
            engine = load_engine(target, draft, llm.model_dump())  # every llm key, one mapping per engine
        workers = {
            kind: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"specvoice-{kind}")
            for kind in ("stt", "tts", "turn")
        }
        if stt is None:
            stt = SpeechToText.from_config(config, executor=workers["stt"])
        if tts is None:
            tts = TextToSpeech(resolve(m.tts, "tts", m.cache_dir), config.tts, executor=workers["tts"])
        vad_path = str(resolve(m.vad, "vad", m.cache_dir).path) if config.vad.engine == "silero" else ""
        wake_dir = str(resolve(m.wake_word, "wake", m.cache_dir).path) if m.wake_word else None
        turn_model = TurnModel.load(config, workers["turn"])
        log.info(
            "assistant loaded",
            extra={
                "seconds": round(time.monotonic() - started, 2),
                "target": llm.base_url if llm.backend == "openai" else m.target,
                "draft": draft,
                "stt": m.stt,
                "tts": m.tts,
            },
        )
        return cls(config, engine, stt, tts, vad_path, wake_dir, workers, turn_model)

    # ---- what sessions are made of -------------------------------------------------------------------------

    def session(
        self,
        on_event: EventHandler | None = None,
        *,
        sink: AudioSink | None = None,
        name: str = "",
        endpointing: bool = True,
    ) -> Session:
        session = Session(self, on_event, sink=sink, name=name, endpointing=endpointing, on_close=self.forget)
        self._sessions.add(session)
        return session

    def forget(self, session: Session) -> None:
        self._sessions.discard(session)
        self.memory.session_closed()

    def decode_settings(self, **overrides: object) -> DecodeSettings:
        """The decoder settings for a turn, from ``config.llm`` (``overrides`` for benchmarks: mode="target").
        The one place the config becomes decode settings."""
        from llm.engine import DecodeSettings

        return DecodeSettings.from_config({**self.config.llm.model_dump(), **overrides})

    def listener(self, *, endpointing: bool = True) -> Listener:
        """A new Listener on the shared STT model, with its own VAD and echo canceller."""
        return Listener.from_config(
            self.config,
            self.stt,
            endpointing=endpointing,
            vad_path=self.vad_path,
            turn_model=self.turn_model,
        )

    def wake_word(self) -> WakePhrase | None:
        """A new wake word (models.wake_word) for the device's own microphone, confirmed by the shared recogniser
        (voice/hearing/wake.py); None when it is off. Only that session listens for one: a websocket app, a
        Wyoming satellite or Home Assistant decide themselves when speech is meant for the assistant."""
        from voice.hearing.stt import SpeechToText

        detector = wake_word(self.config, self.wake_dir) if self.wake_dir is not None else None
        if detector is None:
            return None
        if not isinstance(stt := self.stt, SpeechToText):
            return WakePhrase(detector, None)  # a recogniser on another machine: no word times to check with
        return WakePhrase(detector, stt, self.config.stt.partial_beam_size)

    @property
    def generation_lock(self) -> asyncio.Lock:
        """One generation at a time, whole turns first come first served (asyncio.Lock wakes waiters in FIFO
        order). One lock per event loop, so an Assistant can outlive a loop (tests, embedding). With a remote LLM
        (``engine.concurrent``) each session gets its own lock: the server schedules, we must not serialise."""
        if self.engine.concurrent:
            return asyncio.Lock()  # a remote server batches sessions itself: each session only orders its own turns
        loop = asyncio.get_running_loop()
        if self._turn_lock is None or self._turn_lock[0] is not loop:
            self._turn_lock = (loop, asyncio.Lock())
        return self._turn_lock[1]

    # ---- events out ----------------------------------------------------------------------------------------

    def add_listener(self, fn: Callable[[str, Event], None]) -> None:
        """Every session's events, e.g. for metrics and the MQTT state topics."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[str, Event], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def broadcast(self, session_id: str, event: Event) -> None:
        for fn in self._listeners:
            try:
                fn(session_id, event)
            except Exception:  # a broken listener must not break the turn
                log.exception("event listener failed")

    # ---- tasks ---------------------------------------------------------------------------------------------

    def spawn(self, job: Job) -> asyncio.Task[object] | None:
        """Run ``job`` in the background (kept alive until done, stopped by ``close``; None when no event loop
        runs)."""
        return self._background.spawn(job)

    async def close(self) -> None:
        for session in list(self._sessions):
            await session.close()
        await self._background.stop()
        self.memory.close()
        for pool in self.workers.values():
            pool.shutdown(wait=False, cancel_futures=True)
