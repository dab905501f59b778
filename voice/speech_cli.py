"""`specvoice transcribe FILE.wav` and `specvoice say TEXT [-o out.wav]`: the ears and the mouth on their own.

``transcribe`` plays the file through the same path a microphone takes (real-time paced blocks -> VAD ->
streaming STT), printing partials live and a final line per utterance. ``say`` runs text through the chunker
and piper into a WAV file or the speaker, and reports the time to first audio.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voice.models import resolve

if TYPE_CHECKING:
    from audio.frames import AudioChunk
    from audio.vad import Vad
    from voice.stt import SpeechToText


def _status(text: str, final: bool = False) -> None:
    """Partials overwrite one line on a terminal; piped output gets one line per update."""
    if sys.stdout.isatty():
        sys.stdout.write("\r\033[K" + (text if final else f"... {text}") + ("\n" if final else ""))
    else:
        sys.stdout.write((text if final else f"... {text}") + "\n")
    sys.stdout.flush()


@dataclass
class Heard:
    """One utterance as the ears heard it, with its times on the audio clock (monotonic seconds)."""

    text: str
    speech_start: float
    speech_end: float  # end of the last voiced sample
    endpoint: float  # when the VAD decided the turn was over
    final_done: float  # when the final transcript was ready
    partials: int
    final_decoded: bool  # False when the last partial pass already covered all the speech


def make_vad(config) -> Vad:
    from audio.vad import Vad

    model = resolve(config.models.vad, "vad", config.models.cache_dir).path if config.vad.engine == "silero" else None
    return Vad(model, engine=config.vad.engine, threshold=config.vad.threshold, min_speech_ms=config.vad.min_speech_ms,
               end_silence_ms=config.vad.end_silence_ms, preroll_ms=config.vad.preroll_ms)


async def listen(source: AsyncIterator[AudioChunk], vad: Vad, stt: SpeechToText, partial_interval_s: float,
                 on_partial: Callable[[str], None] | None = None, adaptive: bool = True) -> AsyncIterator[Heard]:
    """The ears: blocks -> VAD -> streaming STT. Partials are decoded in the background while audio keeps
    arriving (at most one at a time): every ``partial_interval_s`` (longer when passes are slow), and at once
    when a pause begins (the speculative pass that makes the final free when the pause turns out to be the
    end); each end of speech yields the final transcript. ``adaptive=False`` keeps the fixed interval (for
    comparisons)."""
    stream = None
    pending: asyncio.Task | None = None
    start_t = last_partial = 0.0
    partials = 0
    pass_s = 0.0  # how long the last partial pass took

    async def partial(s) -> None:
        nonlocal partials, pass_s
        started = time.monotonic()
        text = await s.partial()
        pass_s = time.monotonic() - started
        if text:
            partials += 1
            if on_partial is not None:
                on_partial(text)

    async for chunk in source:
        if stream is not None:
            stream.add(chunk.samples)
        for event in vad.process(chunk):
            if event.kind == "speech_start":
                stream, partials = stt.stream(), 0
                stream.add(event.audio)
                start_t = event.t
                last_partial = chunk.end_t
            elif stream is not None:
                if pending is not None:
                    await pending
                    pending = None
                text = await stream.final()
                yield Heard(text, start_t, event.t, event.decided_t or chunk.end_t, time.monotonic(), partials,
                            bool(stream.final_decoded))
                stream = None
        if stream is not None and (pending is None or pending.done()):
            pause = vad.pause_since
            # a pass at the start of a pause usually sees all the speech, so the final needs no new pass;
            # regular passes keep the CPU at most half busy, so one is rarely still running when speech ends
            interval = max(partial_interval_s, 2 * pass_s) if adaptive else partial_interval_s
            if chunk.end_t - last_partial >= interval or (pause is not None and last_partial < pause):
                last_partial = chunk.end_t
                pending = asyncio.create_task(partial(stream))
    if pending is not None:
        await pending


async def transcribe_file(config, path: str) -> list[str]:
    from audio.sources import WavSource
    from voice.stt import SpeechToText

    stt = SpeechToText(resolve(config.models.stt, "stt", config.models.cache_dir), config.stt)
    source = WavSource(path, block_ms=config.audio.block_ms, tail_silence_ms=config.vad.end_silence_ms + 200)
    finals = []
    async for heard in listen(source, make_vad(config), stt, config.stt.partial_interval_ms / 1000, _status):
        _status(heard.text or "(no words)", final=True)
        finals.append(heard.text)
    if not finals:
        print("(no speech found)")
    return finals


def transcribe_main(config, args, extra: list[str]) -> int:
    from audio.wavfile import WavFormatError

    try:
        asyncio.run(transcribe_file(config, args.file))
    except WavFormatError as exc:
        print(f"specvoice: {exc}", file=sys.stderr)
        return 2
    return 0


async def speak(config, text: str, out: str | None) -> dict[str, float]:
    from audio.resample import resample
    from audio.sinks import SpeakerSink, WavSink
    from voice.chunker import Chunker
    from voice.tts import TextToSpeech

    tts = TextToSpeech(resolve(config.models.tts, "tts", config.models.cache_dir), config.tts)
    if out:
        sink = WavSink(out, tts.sample_rate, realtime=False)
    else:
        sink = SpeakerSink(config.audio.output_device, tts.sample_rate, block_ms=config.audio.block_ms)
    chunker = Chunker(config.tts.first_fragment_chars, config.tts.max_fragment_words)
    t0 = time.monotonic()
    first_audio = None
    sink.begin_utterance()
    try:
        for fragment in chunker.push(text) + chunker.flush():
            async for pcm in tts.stream(fragment):
                first_audio = first_audio or time.monotonic()
                await sink.write(resample(pcm, tts.sample_rate, sink.sample_rate))
        await sink.drain()
    finally:
        sink.close()
    return {"first_audio_s": (first_audio or t0) - t0, "audio_s": sink.played_samples / sink.sample_rate}


def say_main(config, args, extra: list[str]) -> int:
    from audio.devices import DeviceError

    try:
        stats = asyncio.run(speak(config, args.text, args.out))
    except DeviceError as exc:
        print(f"specvoice: {exc}", file=sys.stderr)
        return 2
    where = args.out or "the speaker"
    print(f"spoke {stats['audio_s']:.2f} s of audio to {where}; first audio after {stats['first_audio_s'] * 1000:.0f} ms",
          file=sys.stderr)
    return 0
