"""The Wyoming server (Home Assistant's voice protocol): asr, tts and a handle (conversation) service.

Built on the ``wyoming`` package's event classes and TCP server; this module only decides what each event means
for the assistant:

- asr: ``transcribe`` (optional), ``audio-start``, ``audio-chunk``... ``audio-stop`` -> ``transcript-start``,
  ``transcript-chunk`` as words become stable *while the audio still arrives*, then ``transcript`` and
  ``transcript-stop``. The audio goes through the same Listener as every other transport (no endpointing: the
  client says when the audio stops); any rate/width/channels the client declares is converted to 16 kHz mono.
- tts: ``synthesize`` -> ``audio-start/-chunk/-stop`` at the voice's rate; the streaming form
  (``synthesize-start``, ``synthesize-chunk``... ``synthesize-stop``) cuts the text with the same clause chunker
  as our own replies and speaks each fragment as soon as it is complete, then ``synthesize-stopped``.
- handle: a ``transcript`` from the client is a question -> ``handled-start``, ``handled-chunk`` per decoded
  piece, ``handled`` (the whole reply) and ``handled-stop``. With a ``conversation_id`` in its context (Home
  Assistant sends one) the history is the conversation's, kept across connections (wyoming_conversations.py).

Wyoming has no authentication, so a server bound beyond loopback needs ``wyoming.allowed_clients``. Whatever a
client sends gets an answer, never a traceback: a broken event header, an oversized or stalled event, or a
client that stops reading ends the connection with an ``error`` event naming the limit and its config key;
a bad field is answered with an ``error`` event and the connection goes on; a turn that fails is reported as
an ``error`` (and ``not-handled``), never as a success. Warnings about clients are rate-limited per address.
A connection takes a session slot (``server.max_sessions``, shared with the websocket API) with its first
complete event, so connections that never finish one cannot lock anyone out.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import numpy as np
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.handle import Handled, HandledChunk, HandledStart, HandledStop, NotHandled
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from voice.config import ConfigError
from voice.dialog.session import Session
from voice.logs import ClientWarnings
from voice.speaking.chunker import Chunker
from voice.transports.common import Shared, is_loopback
from voice.transports.wyoming.asr import AsrStream
from voice.transports.wyoming.conversations import Conversations, ConversationsFull, Routed
from voice.transports.wyoming.info import describe
from voice.transports.wyoming.io import EventReader, ProtocolProblem, Refused, WyomingSink, conversation_id, text_field

log = logging.getLogger("specvoice.wyoming")

CHUNK_SAMPLES = 2048  # audio-chunk size we send (~93 ms at 22.05 kHz)


class Gate:
    """What every connection of one Wyoming server shares: the allow-list, the open connections, the
    conversations kept across connections and the per-client warning budget."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.config = shared.config
        self.networks = self.check_config(shared.config)
        self.handlers: set[WyomingHandler] = set()
        w = shared.config.wyoming
        self.conversations = Conversations(self.new_session, w.max_conversations, w.conversation_idle_s)
        self.warnings = ClientWarnings(log)

    @staticmethod
    def check_config(config: Any) -> list[Any]:
        """The allow-list as networks; refuses an exposed bind without one (Wyoming has no authentication)."""
        w = config.wyoming
        if not is_loopback(w.host) and not w.allowed_clients:
            raise ConfigError(
                f"wyoming.host = {w.host!r} exposes the Wyoming server, which has no authentication; "
                "fix: set wyoming.allowed_clients (e.g. ['192.168.1.0/24']) or bind to 127.0.0.1"
            )
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

    def new_session(self, on_event: Any, sink: Any = None, name: str = "") -> Session:
        return self.shared.assistant.session(on_event, sink=sink, endpointing=False, name=name)

    async def close(self) -> None:
        await self.conversations.close()


class WyomingHandler(AsyncEventHandler):
    """One Wyoming connection: requests answered one at a time, with one lazily created session of its own."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Gate) -> None:
        super().__init__(reader, writer)
        s, w = server.config.server, server.config.wyoming
        self.events = EventReader(reader, s.max_message_bytes, s.idle_timeout_s, w.read_timeout_s)
        self.write_s = w.write_timeout_s
        self.server = server
        self.assistant = server.shared.assistant
        peer = writer.get_extra_info("peername")
        self.client = str(peer[0]) if peer else "unknown"
        self._own: Routed | None = None  # this connection's session (tts, and handle without a conversation id)
        self._has_slot = False
        self._gone = False  # a write failed: the client is not reading any more
        self.asr = AsrStream(lambda: self.assistant.listener(endpointing=False), s.max_turn_audio_s, self.write_event)
        # tts
        self._chunker: Chunker | None = None  # a synthesize stream is open
        self._audio_started = False
        self._tts_failed = False  # the current synthesis failed: the rest of its text is not spoken

    # ---- connection ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        metrics = self.server.shared.metrics
        if not self.server.allowed(self.client):
            metrics.rejected.labels("wyoming", "allow_list").inc()
            await self._refuse(f"{self.client} is not in wyoming.allowed_clients", "not_allowed")
            return
        self.server.handlers.add(self)
        self._is_running = True
        try:
            while self._is_running:
                try:
                    event = await self.events.read()
                except ProtocolProblem as problem:
                    await self._end_with(problem)
                    break
                if event is None or not (self._has_slot or await self._take_slot()):
                    break
                if not await self.handle_event(event):
                    break
        except ConnectionError:
            pass
        finally:
            self.server.handlers.discard(self)
            await self.disconnect()
            if self._gone:
                self.writer.transport.abort()  # what it did not read is dropped, not kept for it
            else:
                self.writer.close()
            if self._has_slot:
                self.server.shared.slots.release()
                metrics.session_closed("wyoming")

    async def _take_slot(self) -> bool:
        """The connection's first complete event takes its session slot; none left: ``busy`` and close."""
        shared = self.server.shared
        if not shared.slots.acquire():
            shared.metrics.rejected.labels("wyoming", "sessions").inc()
            await self._refuse(
                f"server busy: {shared.slots.limit} sessions open (server.max_sessions); try again later", "busy"
            )
            return False
        self._has_slot = True
        shared.metrics.session_opened("wyoming")
        return True

    async def _refuse(self, text: str, code: str) -> None:
        with contextlib.suppress(ConnectionError):
            await self.write_event(Error(text, code).event())
        self.writer.close()

    async def _end_with(self, problem: ProtocolProblem) -> None:
        self.server.shared.metrics.protocol_errors.labels("wyoming", problem.code).inc()
        if problem.code == "idle_timeout":
            log.info("closing an idle connection", extra={"client": self.client})
        else:
            self.server.warnings.warn(self.client, "wyoming client closed: " + problem.text, code=problem.code)
        with contextlib.suppress(ConnectionError):
            await self.write_event(problem.event())

    async def write_event(self, event: Event) -> None:
        """Write one event; a client that reads nothing for ``wyoming.write_timeout_s`` is gone."""
        if self._gone:
            raise ConnectionResetError("the client stopped reading")
        try:
            async with asyncio.timeout(self.write_s):
                await async_write_event(event, self.writer)
        except TimeoutError:
            self._gone = True
            log.info("dropping a client that stopped reading", extra={"client": self.client})
            raise ConnectionResetError(
                f"the client read nothing for {self.write_s:g} s (wyoming.write_timeout_s)"
            ) from None
        except ConnectionError:
            self._gone = True
            raise

    async def disconnect(self) -> None:
        await self.asr.close()
        if self._own is not None:
            await self._own.session.close()
            self._own = None

    @property
    def busy(self) -> bool:
        return self.events.busy

    def own(self) -> Routed:
        if self._own is None:
            sink = WyomingSink(self._write_audio, self.assistant.tts_sample_rate)
            self._own = Routed(lambda route: self.server.new_session(route, sink, f"wyoming-{id(self):x}"))
        return self._own

    async def error(self, text: str, code: str, *, client_fault: bool = True) -> None:
        """Tell the client what went wrong; a warning (rate-limited per client) when it was the client's doing
        (a failed turn was logged where it failed)."""
        self.server.shared.metrics.protocol_errors.labels("wyoming", code).inc()
        if client_fault:
            self.server.warnings.warn(self.client, "wyoming request refused: " + text, code=code)
        await self.write_event(Error(text, code).event())

    # ---- events --------------------------------------------------------------------------------------------

    async def handle_event(self, event: Event) -> bool:
        self.events.busy = True
        try:
            return await self._handle(event)
        except ConnectionError:
            return False
        except Refused as refused:
            await self.error(refused.text, refused.code)
            return True
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a field missing or of the wrong type
            await self.error(f"malformed {event.type[:40]!r} event: {type(exc).__name__}: {exc}", "bad_event")
            return True
        except Exception as exc:  # a bug must cost one request, not the server (and is logged with its traceback)
            self.server.warnings.warn(self.client, "wyoming event failed", exc_info=True, type=event.type[:40])
            await self.error(f"internal error: {type(exc).__name__}: {exc}", "server_error")
            return True
        finally:
            self.events.busy = False

    async def _handle(self, event: Event) -> bool:
        kind = event.type
        if kind == "describe":
            await self.write_event(describe(self.server.config, self.assistant).event())
        elif Transcribe.is_type(kind):
            language = Transcribe.from_event(event).language
            self.asr.language = language if isinstance(language, str) else None
        elif AudioStart.is_type(kind):
            await self.asr.start(AudioStart.from_event(event))
        elif AudioChunk.is_type(kind):
            await self.asr.chunk(AudioChunk.from_event(event))
        elif AudioStop.is_type(kind):
            await self.asr.stop()
        elif Synthesize.is_type(kind):
            if self._chunker is None:  # inside a stream it is only the compatibility copy
                await self._synthesize(text_field(event))
        elif SynthesizeStart.is_type(kind):
            self._chunker = Chunker.from_config(self.server.config.tts)
            self._audio_started = self._tts_failed = False
        elif SynthesizeChunk.is_type(kind):
            await self._synthesize_chunk(text_field(event))
        elif SynthesizeStop.is_type(kind):
            await self._synthesize_stop()
        elif Transcript.is_type(kind):
            await self._handle_text(text_field(event), conversation_id(event))
        else:
            await self.error(
                f"unsupported event type {kind[:40]!r}; this server handles describe, transcribe, "
                "audio-start/-chunk/-stop, synthesize(-start/-chunk/-stop) and transcript",
                "unsupported",
            )
        return True

    # ---- tts -----------------------------------------------------------------------------------------------

    async def _synthesize(self, text: str) -> None:
        if not text.strip():
            await self.error("synthesize needs non-empty text", "empty_text")
            return
        chunker = Chunker.from_config(self.server.config.tts)
        self._audio_started, self._tts_failed = False, False
        await self._speak(chunker.push(text) + chunker.flush())
        await self.write_event(AudioStop().event())

    async def _speak(self, fragments: list[str]) -> None:
        """Speak each fragment in its own short turn (audio through the sink); stop at the first failure."""
        if not self._audio_started:
            self._audio_started = True
            await self.write_event(AudioStart(rate=self.assistant.tts_sample_rate, width=2, channels=1).event())
        for fragment in fragments:
            if self._tts_failed:
                return
            _, failure = await self.own().run(_saying(fragment))
            if failure is not None:
                self._tts_failed = True
                await self.error(
                    f"speech synthesis failed ({failure}); the rest of the text was not spoken",
                    "tts_failed",
                    client_fault=False,
                )

    async def _write_audio(self, samples: np.ndarray, rate: int) -> None:
        for i in range(0, len(samples), CHUNK_SAMPLES):
            pcm = samples[i : i + CHUNK_SAMPLES].astype("<i2").tobytes()
            await self.write_event(AudioChunk(rate=rate, width=2, channels=1, audio=pcm).event())

    async def _synthesize_chunk(self, text: str) -> None:
        if self._chunker is None:
            await self.error("synthesize-chunk outside a stream; send synthesize-start first", "no_stream")
            return
        fragments = self._chunker.push(text)
        if fragments:
            await self._speak(fragments)

    async def _synthesize_stop(self) -> None:
        chunker, self._chunker = self._chunker, None
        if chunker is None:
            await self.error("synthesize-stop outside a stream; send synthesize-start first", "no_stream")
            return
        rest = chunker.flush()
        if rest or self._audio_started:
            await self._speak(rest)
            await self.write_event(AudioStop().event())
        await self.write_event(SynthesizeStopped().event())

    # ---- handle (conversation) ----------------------------------------------------------------------------

    async def _handle_text(self, text: str, conversation_id: str | None) -> None:
        context = {"conversation_id": conversation_id} if conversation_id else None
        if not text.strip():
            await self.write_event(NotHandled("I did not hear a question.", context=context).event())
            return
        try:
            async with self._conversation(conversation_id) as routed:
                await self.write_event(HandledStart().event())

                async def chunk(piece: str) -> None:
                    await self.write_event(HandledChunk(piece).event())

                done, failure = await routed.run(lambda session: session.ask(text, speak=False, spoken=True), chunk)
                if failure is None:
                    await self.write_event(Handled(done.reply, context=context).event())
                else:
                    await self.error(f"the reply failed ({failure})", "turn_failed", client_fault=False)
                    await self.write_event(NotHandled(f"The assistant failed: {failure}", context=context).event())
                await self.write_event(HandledStop().event())
        except ConversationsFull as exc:
            await self.error(str(exc), "busy")
            await self.write_event(NotHandled(str(exc), context=context).event())

    @contextlib.asynccontextmanager
    async def _conversation(self, conversation_id: str | None) -> AsyncIterator[Routed]:
        """The server's session for this conversation id, or without one this connection's own."""
        if conversation_id is None:
            yield self.own()
        else:
            async with self.server.conversations.use(conversation_id) as routed:
                yield routed


def _saying(text: str) -> Callable[[Session], Coroutine[Any, Any, object]]:
    return lambda session: session.say(text)
