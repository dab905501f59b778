"""The Wyoming server (Home Assistant's voice protocol): asr, tts and a handle (conversation) service.

Built on the ``wyoming`` package's own server, handler and event classes; this module only decides what each
event means for an assistant session:

- asr: ``transcribe`` (optional), ``audio-start``, ``audio-chunk``... ``audio-stop`` -> ``transcript-start``,
  ``transcript-chunk`` as words become stable *while the audio still arrives*, then ``transcript`` and
  ``transcript-stop``. Any rate/width/channels the client declares is converted to 16 kHz mono 16-bit.
- tts: ``synthesize`` -> ``audio-start/-chunk/-stop`` at the voice's rate; the streaming form
  (``synthesize-start``, ``synthesize-chunk``... ``synthesize-stop``) speaks each sentence as soon as it is
  complete and ends with ``synthesize-stopped``. The compatibility ``synthesize`` sent inside a stream is ignored.
- handle: a ``transcript`` from the client is a question -> ``handled-start``, ``handled-chunk`` per decoded
  piece, ``handled`` (the whole reply) and ``handled-stop``.

The info event sets every streaming flag to True because each of the three is streamed as described. Wyoming
has no authentication, so a server bound beyond loopback needs ``wyoming.allowed_clients``. Oversized events,
idle connections and overlong audio end with an ``error`` event that names the limit and its config key.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

import numpy as np
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.handle import Handled, HandledChunk, HandledStart, HandledStop, NotHandled
from wyoming.info import (AsrModel, AsrProgram, Attribution, Describe, HandleModel, HandleProgram, Info,
                          TtsProgram, TtsVoice)
from wyoming.server import AsyncEventHandler, AsyncTcpServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from voice.config import ConfigError
from voice.events import ReplyAudio, ReplyTextDelta

if TYPE_CHECKING:
    from voice.assistant import Assistant, Session
    from voice.config import Config
    from voice.metrics import Metrics
    from voice.serve import SessionSlots

log = logging.getLogger("specvoice.wyoming")

MIC_RATE = 16000
CHUNK_SAMPLES = 2048            # audio-chunk size we send (~93 ms at 22.05 kHz)
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n+")


def _version() -> str:
    try:
        return version("specvoice")
    except PackageNotFoundError:
        return "0"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _BoundedReader:
    """Wraps the connection's StreamReader so one event can never claim more than ``limit`` bytes and a silent
    client is dropped after ``idle_s``. wyoming's reader trusts ``data_length``/``payload_length``; this is where
    a hostile length is refused. Problems end the read (EOF) and are kept in ``problem`` for the handler."""

    def __init__(self, reader: asyncio.StreamReader, limit: int, idle_s: float) -> None:
        self._reader, self.limit, self.idle_s = reader, limit, idle_s
        self.problem: Error | None = None
        self.busy = False  # a request is being answered: the idle clock does not run

    async def readline(self) -> bytes:
        while True:
            try:
                return await asyncio.wait_for(self._reader.readline(), timeout=self.idle_s)
            except asyncio.TimeoutError:
                if self.busy:
                    continue
                self.problem = Error(f"idle for {self.idle_s:g} s; closing (server.idle_timeout_s)", "idle_timeout")
                return b""
            except ValueError:  # the header line is longer than the stream's limit
                self.problem = Error("event header line too long; closing", "message_too_big")
                return b""

    async def readexactly(self, n: int) -> bytes:
        if n > self.limit:
            self.problem = Error(f"event of {n} bytes exceeds the {self.limit}-byte limit "
                                 "(server.max_message_bytes); send smaller audio chunks", "message_too_big")
            raise ValueError(self.problem.text)   # wyoming's reader turns this into end-of-stream
        return await self._reader.readexactly(n)

    def feed_eof(self) -> None:
        self._reader.feed_eof()


class WyomingHandler(AsyncEventHandler):
    """One Wyoming connection: one lazily created session, requests answered one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: WyomingServer) -> None:
        s = server.config.server
        self.bounded = _BoundedReader(reader, s.max_message_bytes, s.idle_timeout_s)
        super().__init__(self.bounded, writer)  # type: ignore[arg-type]  # duck-typed: readline/readexactly
        self.server = server
        self.peer = writer.get_extra_info("peername")
        self._session: Session | None = None
        self._events: asyncio.Queue = asyncio.Queue()   # session events for the request in progress
        # asr
        self._stream = None
        self._converter: AudioChunkConverter | None = None
        self._asr_seconds = 0.0
        self._sent = ""             # transcript text already sent as chunks
        self._started = False       # transcript-start sent
        self._partials: asyncio.Task | None = None
        self._language: str | None = None
        # tts streaming
        self._tts_stream = False
        self._tts_text = ""
        self._tts_audio_started = False

    # ---- connection ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        host = self.peer[0] if self.peer else ""
        if not self.server.allowed(host):
            self.server.metrics.rejected.labels("wyoming", "allow_list").inc()
            await self._refuse(f"{host} is not in wyoming.allowed_clients", "not_allowed")
            return
        if not self.server.slots.acquire():
            self.server.metrics.rejected.labels("wyoming", "sessions").inc()
            await self._refuse(f"server busy: {self.server.slots.limit} sessions open (server.max_sessions); "
                               "try again later", "busy")
            return
        self.server.handlers.add(self)
        self.server.metrics.session_opened("wyoming")
        try:
            await super().run()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.server.handlers.discard(self)
            self.server.slots.release()
            self.server.metrics.session_closed("wyoming")

    async def _refuse(self, text: str, code: str) -> None:
        try:
            await self.write_event(Error(text, code).event())
        except ConnectionError:
            pass
        self.writer.close()

    async def disconnect(self) -> None:
        if self.bounded.problem is not None:
            self.server.metrics.protocol_errors.labels("wyoming", self.bounded.problem.code or "error").inc()
            try:
                await self.write_event(self.bounded.problem.event())
            except ConnectionError:
                pass
        await self._stop_partials()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def busy(self) -> bool:
        return self.bounded.busy

    def session(self) -> Session:
        if self._session is None:
            self._session = self.server.assistant.session(self._events.put_nowait, name=f"wyoming-{id(self):x}")
        return self._session

    async def error(self, text: str, code: str) -> None:
        self.server.metrics.protocol_errors.labels("wyoming", code).inc()
        await self.write_event(Error(text, code).event())

    # ---- events --------------------------------------------------------------------------------------------

    async def handle_event(self, event: Event) -> bool:
        self.bounded.busy = True
        try:
            return await self._handle(event)
        except ConnectionError:
            return False
        except (KeyError, TypeError, ValueError, AttributeError) as exc:   # a field missing or of the wrong type
            await self.error(f"malformed {event.type!r} event: {type(exc).__name__}: {exc}", "bad_event")
            return True
        except Exception as exc:  # a bug must cost one request, not the server
            log.exception("wyoming event failed", extra={"type": event.type})
            await self.error(f"internal error: {type(exc).__name__}: {exc}", "server_error")
            return True
        finally:
            self.bounded.busy = False

    async def _handle(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(self.server.info().event())
        elif Transcribe.is_type(event.type):
            self._language = Transcribe.from_event(event).language
        elif AudioStart.is_type(event.type):
            await self._audio_start(AudioStart.from_event(event))
        elif AudioChunk.is_type(event.type):
            await self._audio_chunk(AudioChunk.from_event(event))
        elif AudioStop.is_type(event.type):
            await self._audio_stop()
        elif Synthesize.is_type(event.type):
            if not self._tts_stream:  # inside a stream it is only the compatibility copy
                synthesize = Synthesize.from_event(event)
                await self._speak(synthesize.text, start=True, stop=True)
        elif SynthesizeStart.is_type(event.type):
            self._tts_stream, self._tts_text, self._tts_audio_started = True, "", False
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
        await self._stop_partials()
        self._converter = AudioChunkConverter(rate=MIC_RATE, width=2, channels=1)
        self._stream = self.server.assistant.stt.stream()
        self._asr_seconds, self._sent, self._started = 0.0, "", False
        self._partials = asyncio.create_task(self._stream_partials(self._stream))

    async def _audio_chunk(self, chunk: AudioChunk) -> None:
        if self._stream is None or self._converter is None:
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
            await self._stop_partials()
            self._stream = None
            await self.error(f"more than {limit:g} s of audio in one request (server.max_turn_audio_s); "
                             "the request was dropped", "audio_too_long")
            return
        converted = self._converter.convert(chunk)
        self._stream.add(np.frombuffer(converted.audio, dtype="<i2").astype(np.int16))

    async def _stream_partials(self, stream) -> None:
        """While audio arrives: re-decode now and then and send the words that became stable."""
        interval = self.server.config.stt.partial_interval_ms / 1000.0
        while True:
            await asyncio.sleep(interval)
            if await stream.partial() is not None:
                await self._send_transcript_chunk(stream.committed)

    async def _send_transcript_chunk(self, text: str) -> None:
        if not self._started:
            self._started = True
            await self.write_event(TranscriptStart(language=self._language).event())
        if text.startswith(self._sent) and len(text) > len(self._sent):
            piece, self._sent = text[len(self._sent):], text
            await self.write_event(TranscriptChunk(piece).event())

    async def _stop_partials(self) -> None:
        if self._partials is not None:
            self._partials.cancel()
            await asyncio.gather(self._partials, return_exceptions=True)
            self._partials = None

    async def _audio_stop(self) -> None:
        if self._stream is None:
            await self.error("audio-stop without audio-start", "no_audio_start")
            return
        await self._stop_partials()
        stream, self._stream = self._stream, None
        text = (await stream.final()).strip() if stream.duration > 0 else ""
        await self._send_transcript_chunk(text)
        await self.write_event(Transcript(text, language=self._language).event())
        await self.write_event(TranscriptStop().event())

    # ---- tts -----------------------------------------------------------------------------------------------

    async def _speak(self, text: str, *, start: bool, stop: bool) -> None:
        """Speak ``text`` with the session's voice, forwarding its audio as it is produced."""
        text = text.strip()
        if not text and start and stop:
            await self.error("synthesize needs non-empty text", "empty_text")
            return
        rate = self.server.assistant.tts_sample_rate
        if start:
            await self.write_event(AudioStart(rate=rate, width=2, channels=1).event())
        if text:
            async def forward(event) -> None:
                if isinstance(event, ReplyAudio):
                    await self._write_audio(event.samples, event.sample_rate)

            task = await self._run_forwarding(self.session().say(text), forward)
            if task.exception() is not None:
                await self.error(f"speech synthesis failed: {task.exception()}", "tts_failed")
        if stop:
            await self.write_event(AudioStop().event())

    async def _run_forwarding(self, work, forward) -> asyncio.Task:
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

    async def _write_audio(self, samples: np.ndarray, rate: int) -> None:
        for i in range(0, len(samples), CHUNK_SAMPLES):
            pcm = samples[i:i + CHUNK_SAMPLES].astype("<i2").tobytes()
            await self.write_event(AudioChunk(rate=rate, width=2, channels=1, audio=pcm).event())

    async def _synthesize_chunk(self, text: str) -> None:
        if not self._tts_stream:
            await self.error("synthesize-chunk outside a stream; send synthesize-start first", "no_stream")
            return
        self._tts_text += text
        *sentences, self._tts_text = _SENTENCE_END.split(self._tts_text)
        for sentence in sentences:
            if sentence.strip():
                await self._speak(sentence, start=not self._tts_audio_started, stop=False)
                self._tts_audio_started = True

    async def _synthesize_stop(self) -> None:
        if not self._tts_stream:
            await self.error("synthesize-stop outside a stream; send synthesize-start first", "no_stream")
            return
        rest, self._tts_text, self._tts_stream = self._tts_text, "", False
        if rest.strip() or self._tts_audio_started:
            await self._speak(rest, start=not self._tts_audio_started, stop=True)
        await self.write_event(SynthesizeStopped().event())

    # ---- handle (conversation) ----------------------------------------------------------------------------

    async def _handle_text(self, text: str) -> None:
        if not text.strip():
            await self.write_event(NotHandled("I did not hear a question.").event())
            return
        await self.write_event(HandledStart().event())
        async def forward(event) -> None:
            if isinstance(event, ReplyTextDelta) and event.text:
                await self.write_event(HandledChunk(event.text).event())

        task = await self._run_forwarding(self.session().ask(text, speak=False), forward)
        if task.exception() is not None:
            await self.write_event(NotHandled(f"The assistant failed: {task.exception()}").event())
        else:
            await self.write_event(Handled(task.result().reply).event())
        await self.write_event(HandledStop().event())


def _format_problem(rate: int, width: int, channels: int) -> str | None:
    if not (isinstance(rate, int) and 8000 <= rate <= 96000):
        return f"unsupported sample rate {rate!r}; send 8000..96000 Hz (16000 is native)"
    if width not in (1, 2, 4):
        return f"unsupported sample width {width!r} bytes; send 2 (16-bit PCM)"
    if channels not in (1, 2):
        return f"unsupported channel count {channels!r}; send mono (1) or stereo (2)"
    return None


class WyomingServer:
    """The TCP listener (wyoming.server.AsyncTcpServer) plus what its handlers share."""

    def __init__(self, config: Config, assistant: Assistant, metrics: Metrics, slots: SessionSlots) -> None:
        self.networks = self.check_config(config)
        self.config = config
        self.assistant = assistant
        self.metrics = metrics
        self.slots = slots
        self.handlers: set[WyomingHandler] = set()
        self._tcp: AsyncTcpServer | None = None
        self._zeroconf = None

    @staticmethod
    def check_config(config: Config) -> list:
        """The allow-list as networks; refuses an exposed bind without one (Wyoming has no authentication)."""
        w = config.wyoming
        if not is_loopback(w.host) and not w.allowed_clients:
            raise ConfigError(f"wyoming.host = {w.host!r} exposes the Wyoming server, which has no authentication; "
                              "fix: set wyoming.allowed_clients (e.g. ['192.168.1.0/24']) or bind to 127.0.0.1")
        try:
            return [ipaddress.ip_network(n, strict=False) for n in w.allowed_clients]
        except ValueError as exc:
            raise ConfigError(f"wyoming.allowed_clients: {exc}; fix: list IP addresses or networks") from None

    @property
    def port(self) -> int:
        assert self._tcp is not None and self._tcp._server is not None
        return self._tcp._server.sockets[0].getsockname()[1]

    def allowed(self, host: str) -> bool:
        if not self.networks:
            return True  # loopback bind: only this machine can connect
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.networks)

    def info(self) -> Info:
        cfg, ver = self.config, _version()
        language = cfg.stt.language or "en"
        me = Attribution(name="specvoice", url="https://github.com/specvoice/specvoice")
        asr = AsrProgram(name="specvoice-stt", attribution=me, installed=True, version=ver,
                         description="faster-whisper with streaming partial transcripts",
                         models=[AsrModel(name=cfg.models.stt, languages=[language], installed=True, version=None,
                                          description=f"Whisper ({cfg.models.stt})",
                                          attribution=Attribution("OpenAI", "https://github.com/openai/whisper"))],
                         supports_transcript_streaming=True)
        tts = TtsProgram(name="specvoice-tts", attribution=me, installed=True, version=ver,
                         description="piper, one sentence at a time",
                         voices=[TtsVoice(name=cfg.models.tts, languages=["en_US"], installed=True, version=None,
                                          description=f"Piper voice {cfg.models.tts}",
                                          attribution=Attribution("rhasspy", "https://github.com/rhasspy/piper"))],
                         supports_synthesize_streaming=True)
        handle = HandleProgram(name="specvoice-assistant", attribution=me, installed=True, version=ver,
                               description="local LLM conversation with a speculative decoder",
                               models=[HandleModel(name=cfg.models.target, languages=[language], installed=True,
                                                   version=None, description=f"LLM {cfg.models.target}",
                                                   attribution=me)],
                               supports_handled_streaming=True)
        return Info(asr=[asr], tts=[tts], handle=[handle])

    async def start(self) -> None:
        w = self.config.wyoming
        self._tcp = AsyncTcpServer(w.host, w.port)
        await self._tcp.start(lambda reader, writer: WyomingHandler(reader, writer, self))
        if w.zeroconf:
            await self._announce()

    async def _announce(self) -> None:
        host = self.config.wyoming.host
        if is_loopback(host):
            raise ConfigError("wyoming.zeroconf = true announces the server on the network, but wyoming.host is "
                              f"{host!r}; fix: bind wyoming.host to the LAN address (and set allowed_clients)")
        try:
            from wyoming.zeroconf import HomeAssistantZeroconf
        except ImportError:
            raise ConfigError("wyoming.zeroconf = true needs the zeroconf package; fix: pip install zeroconf") from None
        self._zeroconf = HomeAssistantZeroconf(port=self.port, name="specvoice",
                                               host=None if host in ("0.0.0.0", "::") else host)
        await self._zeroconf.register_server()

    async def stop(self, grace: float) -> None:
        """Stop listening, let requests in progress finish for up to ``grace`` s, then close every connection."""
        if self._tcp is None:
            return
        if self._tcp._server is not None:
            self._tcp._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while any(h.busy for h in self.handlers) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await self._tcp.stop()
        if self._zeroconf is not None:
            await self._zeroconf._aiozc.async_close()
        self._tcp = None
