"""Speech on another machine, over Wyoming: a thin device keeps VAD, wake word, echo gate and audio, and sends
the user's speech to an asr server and the reply's sentences to a tts server (another ``specvoice serve``, or
Home Assistant's wyoming-faster-whisper / wyoming-piper).

The two classes stand where ``voice.hearing.stt.SpeechToText`` and ``voice.speaking.tts.TextToSpeech`` stand, so
the Listener and the Turn do not know the difference:

- ``RemoteSpeechToText.stream()`` opens one connection per utterance when speech starts and streams the audio as
  it arrives (``transcribe``, ``audio-start``, ``audio-chunk``...); ``partial()`` reports the words the server has
  sent as ``transcript-chunk`` so far (a specvoice server streams them; wyoming-faster-whisper sends none, so
  partials stay empty there) and ``final()`` sends ``audio-stop`` and waits for the ``transcript``. The audio is
  also kept here, so a dropped connection is retried once with all of it. ``nothing_new()`` is always False: we
  cannot know whether the server has already seen every word, so no early reply starts on a remote pause.
- ``RemoteTextToSpeech.stream(fragment)`` is one ``synthesize`` on its own connection; closing the stream (a
  barge-in) closes the connection, which stops the server. ``sample_rate`` and ``language`` are asked once at
  load (``describe`` and a one-word synthesis); audio at any other rate is converted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from wyoming.asr import Transcribe, Transcript, TranscriptChunk
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from audio.frames import SPEECH_RATE
from voice.config import STTConfig, TTSConfig
from voice.tasks import cancel_and_wait, start

log = logging.getLogger("specvoice.remote_speech")

IDLE_S = 30.0  # an utterance that gets no audio for this long was abandoned: its connection is closed
FALLBACK_RATE = 22050  # piper's medium voices, when the tts server cannot be asked at load


class RemoteSpeechError(RuntimeError):
    """A Wyoming speech server failed; the message names it and the fix."""


class _Peer:
    """A Wyoming server at ``tcp://host:port`` and how long to wait for it."""

    def __init__(self, kind: str, uri: str, timeout_s: float) -> None:
        parts = urlsplit(uri)
        assert parts.hostname and parts.port, "the config checks the uri"
        self.kind, self.uri, self.timeout_s = kind, uri, timeout_s
        self.host, self.port = parts.hostname, parts.port

    async def connect(self) -> AsyncTcpClient:
        client = AsyncTcpClient(self.host, self.port, connect_timeout=self.timeout_s)
        try:
            await client.connect()
        except (OSError, TimeoutError) as exc:
            raise self.error(f"cannot connect ({type(exc).__name__}: {exc})") from None
        return client

    def error(self, what: str) -> RemoteSpeechError:
        return RemoteSpeechError(
            f"the Wyoming {self.kind} server at {self.uri}: {what}; fix: start it, or correct "
            f"{'stt' if self.kind == 'asr' else 'tts'}.uri"
        )

    async def read(self, client: AsyncTcpClient) -> Any:
        event = await client.read_event()
        if event is None:
            raise self.error("closed the connection")
        if Error.is_type(event.type):
            raise self.error(f"answered with an error: {Error.from_event(event).text}")
        return event


class RemoteSpeechToText:
    """Whisper on a Wyoming asr server, behind ``SpeechToText``'s interface (``stream()``, ``transcribe()``)."""

    def __init__(self, settings: STTConfig) -> None:
        assert settings.uri is not None, "the config checks that stt.backend = 'wyoming' has a uri"
        self.peer = _Peer("asr", settings.uri, settings.timeout_s)
        self.language = settings.language
        self.passes = 0  # final transcripts asked for (what SpeechToText counts as decoder passes)
        self.decoded_s = 0.0

    def stream(self) -> RemoteTranscription:
        return RemoteTranscription(self)

    async def transcribe(self, samples: np.ndarray) -> str:
        """Whole-utterance transcription (int16 16 kHz)."""
        stream = self.stream()
        stream.add(samples)
        return await stream.final()


class RemoteTranscription:
    """One utterance streamed to the asr server; ``StreamingTranscription``'s interface."""

    def __init__(self, stt: RemoteSpeechToText) -> None:
        self.stt = stt
        self._audio: list[np.ndarray] = []
        self._samples = 0
        self._committed = ""  # what the server's transcript-chunks said so far
        self._reported = ""
        self._final: str | None = None
        self.passes = 0
        self.final_decoded: bool | None = None
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task = start(self._run(self._queue), name="wyoming asr")
        self._task.add_done_callback(_retrieved)  # an utterance dropped without final(): its error is not news

    def add(self, samples: np.ndarray) -> None:
        if samples.dtype != np.int16:
            raise ValueError(f"add() takes 16 kHz int16 samples (got {samples.dtype})")
        self._audio.append(samples.copy())
        self._samples += len(samples)
        if not self._task.done():
            self._queue.put_nowait(samples.astype("<i2").tobytes())

    @property
    def duration(self) -> float:
        return self._samples / SPEECH_RATE

    @property
    def committed(self) -> str:
        return self._final if self._final is not None else self._committed.strip()

    @property
    def tentative(self) -> str:
        return ""

    @property
    def text(self) -> str:
        return self.committed

    def nothing_new(self) -> bool:
        return False

    @property
    def elapsed(self) -> float:
        return self.duration

    def text_before(self, t: float) -> str:
        """The words before ``t``: the server sends no word times, so all of them."""
        return self.text

    async def partial(
        self, *, style: str | None = None, final_beam: bool = False, min_new_s: float = 0.0
    ) -> str | None:
        """The words the server has sent while the audio streams; None when nothing changed since last asked.
        The Listener's hints for a local pass (prompt, beam, minimum new audio) mean nothing here."""
        text = self.text
        if not text or text == self._reported:
            return None
        self._reported = text
        return text

    async def fits(self, texts: Sequence[str]) -> list[float] | None:
        """A remote recogniser scores no texts against the audio: its words stand."""
        return None

    async def final(self) -> str:
        """End the audio and wait for the transcript; one retry with all the audio on a fresh connection."""
        if self._final is not None:
            return self._final
        self.final_decoded = True
        self.passes += 1
        self.stt.passes += 1
        self.stt.decoded_s += self.duration
        if not self._task.done():
            self._queue.put_nowait(None)
        try:
            text = await self._task
        except RemoteSpeechError as exc:
            log.info("wyoming asr retry with the whole utterance", extra={"error": str(exc)})
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()
            for samples in self._audio:
                queue.put_nowait(samples.astype("<i2").tobytes())
            queue.put_nowait(None)
            self._committed = ""
            self._task = start(self._run(queue), name="wyoming asr retry")
            self._task.add_done_callback(_retrieved)
            text = await self._task
        self._final = text.strip()
        return self._final

    async def _run(self, queue: asyncio.Queue[bytes | None]) -> str:
        """One connection: stream the queued audio, then the transcript."""
        peer = self.stt.peer
        client = await peer.connect()
        reader: asyncio.Task[str] | None = None
        try:
            await client.write_event(Transcribe(language=self.stt.language).event())
            await client.write_event(AudioStart(rate=SPEECH_RATE, width=2, channels=1).event())
            reader = start(self._read(client), name="wyoming asr reader")
            while (audio := await self._next(queue, reader)) is not None:
                await client.write_event(AudioChunk(rate=SPEECH_RATE, width=2, channels=1, audio=audio).event())
            await client.write_event(AudioStop().event())
            async with asyncio.timeout(peer.timeout_s):
                return await reader
        except (OSError, TimeoutError) as exc:
            raise peer.error(f"failed while transcribing ({type(exc).__name__}: {exc})") from None
        finally:
            await cancel_and_wait(reader)
            await client.disconnect()

    @staticmethod
    async def _next(queue: asyncio.Queue[bytes | None], reader: asyncio.Task[str]) -> bytes | None:
        """The next audio to send (None: the utterance is over). A server that already failed or answered
        ends the wait; so does an utterance abandoned without final() (IDLE_S)."""
        getter = start(queue.get())
        done, _ = await asyncio.wait({getter, reader}, timeout=IDLE_S, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            await cancel_and_wait(getter)
            if reader in done:
                reader.result()  # raises the server's error
                return None
            raise TimeoutError(f"no audio for {IDLE_S:g} s")
        return getter.result()

    async def _read(self, client: AsyncTcpClient) -> str:
        while True:
            event = await self.stt.peer.read(client)
            if TranscriptChunk.is_type(event.type):
                self._committed += TranscriptChunk.from_event(event).text
            elif Transcript.is_type(event.type):
                return Transcript.from_event(event).text


class RemoteTextToSpeech:
    """Piper (or any voice) on a Wyoming tts server, behind ``TextToSpeech``'s interface."""

    def __init__(self, settings: TTSConfig) -> None:
        assert settings.uri is not None, "the config checks that tts.backend = 'wyoming' has a uri"
        self.peer = _Peer("tts", settings.uri, settings.timeout_s)
        self.voice = settings.voice
        self.chunks_made = 0
        self._rate = FALLBACK_RATE  # of the latest synthesis (its audio-start)
        self.sample_rate, self.language = FALLBACK_RATE, "und"
        with ThreadPoolExecutor(max_workers=1) as pool:  # our own loop, whoever calls (load runs in a thread)
            try:
                self.sample_rate, self.language = pool.submit(asyncio.run, self._probe()).result()
            except RemoteSpeechError as exc:
                log.warning(
                    "wyoming tts not reachable at load; assuming %d Hz", FALLBACK_RATE, extra={"error": str(exc)}
                )
        self.chunks_made = 0  # the probe's do not count

    async def _probe(self) -> tuple[int, str]:
        """The voice's language (describe) and sample rate (a one-word synthesis)."""
        client = await self.peer.connect()
        try:
            await client.write_event(Describe().event())
            info = Info.from_event(await self.peer.read(client))
        finally:
            await client.disconnect()
        voices = [v for program in info.tts for v in program.voices if self.voice in (None, v.name)]
        if not voices:
            raise self.peer.error(f"has no voice {self.voice!r}" if self.voice else "offers no tts voice")
        async with contextlib.aclosing(self.stream("Ready.")) as first:
            await anext(first, None)  # its audio-start says the rate
        return self._rate, (voices[0].languages or ["und"])[0]

    async def stream(self, fragment: str) -> AsyncGenerator[np.ndarray, None]:
        """Int16 mono chunks at ``sample_rate`` as the server sends them. One generator, no inner one: a stream
        abandoned mid-way (a barge-in) is closed in one step, and so is its connection."""
        if not fragment.strip():
            return
        converter = AudioChunkConverter(rate=self.sample_rate, width=2, channels=1)
        client = await self.peer.connect()
        try:
            voice = SynthesizeVoice(name=self.voice) if self.voice else None
            await client.write_event(Synthesize(text=fragment, voice=voice).event())
            async with asyncio.timeout(self.peer.timeout_s):
                event = await self.peer.read(client)  # audio-start, within the timeout
            while not AudioStop.is_type(event.type):
                if AudioStart.is_type(event.type):
                    self._rate = AudioStart.from_event(event).rate
                elif AudioChunk.is_type(event.type):
                    self.chunks_made += 1
                    yield np.frombuffer(converter.convert(AudioChunk.from_event(event)).audio, dtype="<i2").astype(
                        np.int16
                    )
                event = await self.peer.read(client)
        except (OSError, TimeoutError) as exc:
            raise self.peer.error(f"failed while speaking ({type(exc).__name__}: {exc})") from None
        finally:
            await client.disconnect()  # early close (barge-in): the server stops at its next write

    def synthesize(self, text: str, stop: Any = None) -> list[np.ndarray]:
        """Blocking: every chunk of ``text`` (for ``specvoice demo``'s spoken questions)."""

        async def collect() -> list[np.ndarray]:
            return [pcm async for pcm in self.stream(text)]

        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, collect()).result()


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
