"""The Wyoming server (Home Assistant's voice protocol): asr, tts and a handle (conversation) service.

Built on the ``wyoming`` package's own server, handler and event classes; this module only decides what each
event means for the assistant:

- asr: ``transcribe`` (optional), ``audio-start``, ``audio-chunk``... ``audio-stop`` -> ``transcript-start``,
  ``transcript-chunk`` as words become stable *while the audio still arrives*, then ``transcript`` and
  ``transcript-stop``. The audio goes through the same Listener as every other transport (no endpointing: the
  client says when the audio stops); any rate/width/channels the client declares is converted to 16 kHz mono.
- tts: ``synthesize`` -> ``audio-start/-chunk/-stop`` at the voice's rate; the streaming form
  (``synthesize-start``, ``synthesize-chunk``... ``synthesize-stop``) cuts the text with the same clause chunker
  as our own replies and speaks each fragment as soon as it is complete, then ``synthesize-stopped``.
- handle: a ``transcript`` from the client is a question -> ``handled-start``, ``handled-chunk`` per decoded
  piece, ``handled`` (the whole reply) and ``handled-stop``.

Wyoming has no authentication, so a server bound beyond loopback needs ``wyoming.allowed_clients``. Oversized
events, idle connections and overlong audio end with an ``error`` event that names the limit and its config key.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import numpy as np
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.handle import Handled, HandledChunk, HandledStart, HandledStop, NotHandled
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from audio.frames import SPEECH_RATE
from voice.chunker import Chunker
from voice.config import ConfigError
from voice.events import ReplyTextDelta, TranscriptPartial
from voice.listener import Listener
from voice.session import Session
from voice.transports.common import Shared, is_loopback
from voice.transports.wyoming_info import describe
from voice.transports.wyoming_io import BoundedReader, WyomingSink

log = logging.getLogger("specvoice.wyoming")

CHUNK_SAMPLES = 2048  # audio-chunk size we send (~93 ms at 22.05 kHz)


class Gate:
    """What every connection of one Wyoming server shares: the allow-list and the open connections."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.config = shared.config
        self.networks = self.check_config(shared.config)
        self.handlers: set[WyomingHandler] = set()

    @staticmethod
    def check_config(config: Any) -> list[Any]:
        """The allow-list as networks; refuses an exposed bind without one (Wyoming has no authentication)."""
        w = config.wyoming
        if not is_loopback(w.host) and not w.allowed_clients:
            raise ConfigError(f"wyoming.host = {w.host!r} exposes the Wyoming server, which has no authentication; "
                              "fix: set wyoming.allowed_clients (e.g. ['192.168.1.0/24']) or bind to 127.0.0.1")
        try:
            return [ipaddress.ip_network(n, strict=False) for n in w.allowed_clients]
        except ValueError as exc:
            raise ConfigError(f"wyoming.allowed_clients: {exc}; fix: list IP addresses or networks") from None

    def allowed(self, host: str) -> bool:
        if not self.networks:
            return True  # loopback bind: only this machine can connect
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.networks)


class WyomingHandler(AsyncEventHandler):
    """One Wyoming connection: one lazily created session, requests answered one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Gate) -> None:
        s = server.config.server
        self.bounded = BoundedReader(reader, s.max_message_bytes, s.idle_timeout_s)
        super().__init__(self.bounded, writer)  # type: ignore[arg-type]  # duck-typed: readline/readexactly
        self.server = server
        self.assistant = server.shared.assistant
        self.peer = writer.get_extra_info("peername")
        self._session: Session | None = None
        self._events: asyncio.Queue[Any] = asyncio.Queue()  # session events for the request in progress
        # asr
        self._listener: Listener | None = None
        self._converter: AudioChunkConverter | None = None
        self._asr_seconds = 0.0
        self._sent = ""  # transcript text already sent as chunks
        self._started = False  # transcript-start sent
        self._language: str | None = None
        # tts streaming
        self._chunker: Chunker | None = None
        self._tts_audio_started = False

    # ---- connection ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        metrics, slots = self.server.shared.metrics, self.server.shared.slots
        host = self.peer[0] if self.peer else ""
        if not self.server.allowed(host):
            metrics.rejected.labels("wyoming", "allow_list").inc()
            await self._refuse(f"{host} is not in wyoming.allowed_clients", "not_allowed")
            return
        if not slots.acquire():
            metrics.rejected.labels("wyoming", "sessions").inc()
            await self._refuse(f"server busy: {slots.limit} sessions open (server.max_sessions); try again later",
                               "busy")
            return
        self.server.handlers.add(self)
        metrics.session_opened("wyoming")
        try:
            await super().run()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.server.handlers.discard(self)
            slots.release()
            metrics.session_closed("wyoming")

    async def _refuse(self, text: str, code: str) -> None:
        try:
            await self.write_event(Error(text, code).event())
        except ConnectionError:
            pass
        self.writer.close()

    async def disconnect(self) -> None:
        problem = self.bounded.problem
        if problem is not None:
            self.server.shared.metrics.protocol_errors.labels("wyoming", problem.code or "error").inc()
            try:
                await self.write_event(problem.event())
            except ConnectionError:
                pass
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def busy(self) -> bool:
        return self.bounded.busy

    def session(self) -> Session:
        if self._session is None:
            sink = WyomingSink(self._write_audio, self.assistant.tts_sample_rate)
            self._session = self.assistant.session(self._events.put_nowait, sink=sink, endpointing=False,
                                                   name=f"wyoming-{id(self):x}")
        return self._session

    async def error(self, text: str, code: str) -> None:
        self.server.shared.metrics.protocol_errors.labels("wyoming", code).inc()
        await self.write_event(Error(text, code).event())

    # ---- events --------------------------------------------------------------------------------------------

    async def handle_event(self, event: Event) -> bool:
        self.bounded.busy = True
        try:
            return await self._handle(event)
        except ConnectionError:
            return False
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a field missing or of the wrong type
            await self.error(f"malformed {event.type!r} event: {type(exc).__name__}: {exc}", "bad_event")
            return True
        except Exception as exc:  # a bug must cost one request, not the server
            log.exception("wyoming event failed", extra={"type": event.type})
            await self.error(f"internal error: {type(exc).__name__}: {exc}", "server_error")
            return True
        finally:
            self.bounded.busy = False

    async def _handle(self, event: Event) -> bool:
        if event.type == "describe":
            await self.write_event(describe(self.server.config, self.assistant).event())
        elif Transcribe.is_type(event.type):
            self._language = Transcribe.from_event(event).language
        elif AudioStart.is_type(event.type):
            await self._audio_start(AudioStart.from_event(event))
        elif AudioChunk.is_type(event.type):
            await self._audio_chunk(AudioChunk.from_event(event))
        elif AudioStop.is_type(event.type):
            await self._audio_stop()
        elif Synthesize.is_type(event.type):
            if self._chunker is None:  # inside a stream it is only the compatibility copy
                await self._speak(Synthesize.from_event(event).text, start=True, stop=True)
        elif SynthesizeStart.is_type(event.type):
            self._chunker, self._tts_audio_started = self.session().ctx.chunker(), False
        elif SynthesizeChunk.is_type(event.type):
            await self._synthesize_chunk(SynthesizeChunk.from_event(event).text)
        elif SynthesizeStop.is_type(event.type):
            await self._synthesize_stop()
        elif Transcript.is_type(event.type):
            await self._handle_text(Transcript.from_event(event).text)
        else:
            await self.error(f"unsupported event type {event.type!r}; this server handles describe, transcribe, "
                             "audio-start/-chunk/-stop, synthesize(-start/-chunk/-stop) and transcript", "unsupported")
        return True

    # ---- asr -----------------------------------------------------------------------------------------------

    async def _audio_start(self, start: AudioStart) -> None:
        problem = _format_problem(start.rate, start.width, start.channels)
        if problem:
            await self.error(problem, "bad_audio_format")
            return
        if self._listener is not None:
            await self._listener.close()
        self._converter = AudioChunkConverter(rate=SPEECH_RATE, width=2, channels=1)
        self._listener = self.assistant.listener(endpointing=False)
        self._asr_seconds, self._sent, self._started = 0.0, "", False

    async def _audio_chunk(self, chunk: AudioChunk) -> None:
        if self._listener is None or self._converter is None:
            await self.error("audio-chunk before audio-start; send audio-start with rate, width and channels first",
                             "no_audio_start")
            return
        problem = _format_problem(chunk.rate, chunk.width, chunk.channels)
        if problem or len(chunk.audio) % (chunk.width * chunk.channels):
            await self.error(problem or f"audio-chunk of {len(chunk.audio)} bytes is not a whole number of "
                             f"{chunk.width * chunk.channels}-byte frames", "bad_audio_format")
            return
        self._asr_seconds += chunk.seconds
        limit = self.server.config.server.max_turn_audio_s
        if self._asr_seconds > limit:
            await self._listener.close()
            self._listener = None
            await self.error(f"more than {limit:g} s of audio in one request (server.max_turn_audio_s); "
                             "the request was dropped", "audio_too_long")
            return
        converted = self._converter.convert(chunk)
        for ev in await self._listener.accept_chunk(np.frombuffer(converted.audio, dtype="<i2").astype(np.int16)):
            if isinstance(ev, TranscriptPartial):
                await self._send_transcript_chunk(ev.committed)

    async def _send_transcript_chunk(self, text: str) -> None:
        if not self._started:
            self._started = True
            await self.write_event(TranscriptStart(language=self._language).event())
        if text.startswith(self._sent) and len(text) > len(self._sent):
            piece, self._sent = text[len(self._sent):], text
            await self.write_event(TranscriptChunk(piece).event())

    async def _audio_stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            await self.error("audio-stop without audio-start", "no_audio_start")
            return
        text = await listener.finish()
        await self._send_transcript_chunk(text)
        await self.write_event(Transcript(text, language=self._language).event())
        await self.write_event(TranscriptStop().event())

    # ---- tts -----------------------------------------------------------------------------------------------

    async def _speak(self, text: str, *, start: bool, stop: bool) -> None:
        """Speak ``text`` with the session's voice; its audio goes out through the session's sink as it comes."""
        text = text.strip()
        if not text and start and stop:
            await self.error("synthesize needs non-empty text", "empty_text")
            return
        if start:
            await self.write_event(AudioStart(rate=self.assistant.tts_sample_rate, width=2, channels=1).event())
        if text:
            task = await self._run_forwarding(self.session().say(text), _ignore)
            if task.exception() is not None:
                await self.error(f"speech synthesis failed: {task.exception()}", "tts_failed")
        if stop:
            await self.write_event(AudioStop().event())

    async def _write_audio(self, samples: np.ndarray, rate: int) -> None:
        for i in range(0, len(samples), CHUNK_SAMPLES):
            pcm = samples[i:i + CHUNK_SAMPLES].astype("<i2").tobytes()
            await self.write_event(AudioChunk(rate=rate, width=2, channels=1, audio=pcm).event())

    async def _synthesize_chunk(self, text: str) -> None:
        if self._chunker is None:
            await self.error("synthesize-chunk outside a stream; send synthesize-start first", "no_stream")
            return
        for fragment in self._chunker.push(text):
            await self._speak(fragment, start=not self._tts_audio_started, stop=False)
            self._tts_audio_started = True

    async def _synthesize_stop(self) -> None:
        chunker, self._chunker = self._chunker, None
        if chunker is None:
            await self.error("synthesize-stop outside a stream; send synthesize-start first", "no_stream")
            return
        rest = " ".join(chunker.flush())
        if rest or self._tts_audio_started:
            await self._speak(rest, start=not self._tts_audio_started, stop=True)
        await self.write_event(SynthesizeStopped().event())

    # ---- handle (conversation) ----------------------------------------------------------------------------

    async def _handle_text(self, text: str) -> None:
        if not text.strip():
            await self.write_event(NotHandled("I did not hear a question.").event())
            return
        await self.write_event(HandledStart().event())

        async def forward(event: Any) -> None:
            if isinstance(event, ReplyTextDelta) and event.text:
                await self.write_event(HandledChunk(event.text).event())

        task = await self._run_forwarding(self.session().ask(text, speak=False), forward)
        if task.exception() is not None:
            await self.write_event(NotHandled(f"The assistant failed: {task.exception()}").event())
        else:
            await self.write_event(Handled(task.result().reply).event())
        await self.write_event(HandledStop().event())

    async def _run_forwarding(self, work: Coroutine[Any, Any, Any],
                              forward: Callable[[Any], Awaitable[None]]) -> asyncio.Task[Any]:
        """Run ``work`` (a session call) while handing the session's events to ``forward`` as they come, until
        the work is done and every event it produced was forwarded. Returns the finished task."""
        task = asyncio.create_task(work)
        try:
            while not (task.done() and self._events.empty()):
                get = asyncio.create_task(self._events.get())
                await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    continue
                await forward(get.result())
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return task


async def _ignore(event: Any) -> None:
    """Events of a synthesis need no forwarding: its audio goes through the sink."""


def _format_problem(rate: int, width: int, channels: int) -> str | None:
    if not (isinstance(rate, int) and 8000 <= rate <= 96000):
        return f"unsupported sample rate {rate!r}; send 8000..96000 Hz (16000 is native)"
    if width not in (1, 2, 4):
        return f"unsupported sample width {width!r} bytes; send 2 (16-bit PCM)"
    if channels not in (1, 2):
        return f"unsupported channel count {channels!r}; send mono (1) or stereo (2)"
    return None
