"""One spoken reply: accepted tokens -> speakable fragments -> TTS -> audio out, with the latency marks.

Two tasks joined by a bounded queue: the producer reads the decoder's stream of accepted text and cuts it into
fragments; the speaker synthesizes each fragment and hands its audio on. So the first clause is spoken while
the rest is still being generated. Cancelling the reply (barge-in) cancels both; ``heard_text`` then says
which words the user actually heard, so the history can be trimmed to them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from voice.chunker import Chunker
from voice.events import Event, ReplyAudio, ReplyTextDelta
from voice.latency import LatencyTrace


@dataclass
class SpokenFragment:
    text: str
    start_sample: int  # position of its first sample in the reply's audio
    n_samples: int = 0
    done: bool = False  # all of its audio was handed on


@dataclass
class ReplyOutcome:
    text: str = ""                       # everything the decoder produced (speakable part)
    fragments: list[SpokenFragment] = field(default_factory=list)
    samples_out: int = 0                 # audio samples handed to the sink/transport

    def heard_text(self, played_samples: int | None) -> str:
        """The reply as far as the user heard it: whole fragments played, plus the words of a partly played one
        in proportion to its played audio (piper has no word timings; words are close to uniform in time)."""
        if played_samples is None:
            played_samples = self.samples_out
        words: list[str] = []
        for frag in self.fragments:
            if frag.n_samples == 0:
                break
            played = min(max(played_samples - frag.start_sample, 0), frag.n_samples)
            frag_words = frag.text.split()
            if played >= frag.n_samples and frag.done:
                words.extend(frag_words)
                continue
            words.extend(frag_words[: int(len(frag_words) * played / frag.n_samples)])
            break
        return " ".join(words)


TextFilter = Callable[[str], str]


class StageError(RuntimeError):
    """A failure inside one stage of the reply ("llm" or "tts"), so the turn can say where it broke."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        super().__init__(detail)
        self.stage = stage


async def speak_reply(
    pieces: AsyncIterator,  # of llm Emission (has .text and .t) or plain str
    *,
    tts,  # None: text only (fragments are still cut, nothing is synthesized)
    chunker: Chunker,
    emit: Callable[[Event], None],
    trace: LatencyTrace,
    outcome: ReplyOutcome,
    sink=None,
    text_filter: TextFilter | None = None,
    text_flush: Callable[[], str] | None = None,
    on_speaking: Callable[[], None] | None = None,
    queue_size: int = 8,
) -> None:
    """Run one reply to the end (or until cancelled). ``outcome`` is filled in as it goes."""
    fragments: asyncio.Queue[str | None] = asyncio.Queue(maxsize=queue_size)

    async def produce() -> None:
        try:
            async for piece in pieces:
                text = piece if isinstance(piece, str) else piece.text
                stamp = time.monotonic() if isinstance(piece, str) else piece.t
                trace.mark("llm_first_token", stamp)
                speakable = text_filter(text) if text_filter else text
                if speakable:
                    emit(ReplyTextDelta(speakable))  # clients see what is spoken, never action markers
                outcome.text += speakable
                for frag in chunker.push(speakable):
                    trace.mark("first_fragment", time.monotonic())
                    await fragments.put(frag)
            tail = text_flush() if text_flush else ""
            if tail:
                emit(ReplyTextDelta(tail))
            outcome.text += tail
            for frag in chunker.push(tail) + chunker.flush():
                trace.mark("first_fragment", time.monotonic())
                await fragments.put(frag)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await fragments.put(None)  # the speaker finishes what it has, then the error surfaces
            raise StageError("llm", exc) from exc
        await fragments.put(None)

    async def speak() -> None:
        while (text := await fragments.get()) is not None:
            frag = SpokenFragment(text, start_sample=outcome.samples_out)
            outcome.fragments.append(frag)
            if tts is None:
                frag.done = True
                continue
            try:
                await _speak_fragment(frag, tts, emit, trace, outcome, sink, on_speaking)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise StageError("tts", exc) from exc
        if sink is not None:
            await sink.drain()
            if sink.first_audible_t is not None:
                trace.mark("playback_start", sink.first_audible_t)

    producer = asyncio.create_task(produce())
    try:
        await speak()
        await producer
    finally:
        if not producer.done():
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)


async def _speak_fragment(frag: SpokenFragment, tts, emit, trace: LatencyTrace, outcome: ReplyOutcome, sink,
                          on_speaking) -> None:
    async for pcm in tts.stream(frag.text):
        if pcm.size == 0:
            continue
        trace.mark("tts_first_audio", time.monotonic())
        if on_speaking:
            on_speaking()
        emit(ReplyAudio(pcm, tts.sample_rate))
        if sink is not None:
            await sink.write(pcm)
            if sink.first_audible_t is not None:
                trace.mark("playback_start", sink.first_audible_t)
        else:
            trace.mark("playback_start", time.monotonic())  # handed to the transport
        frag.n_samples += len(pcm)
        outcome.samples_out += len(pcm)
    frag.done = True
