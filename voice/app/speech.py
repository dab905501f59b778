"""`specvoice transcribe FILE.wav` and `specvoice say TEXT [-o out.wav]`: the ears and the mouth on their own.

``transcribe`` plays the file through the same Listener a microphone feeds (real-time paced blocks -> VAD ->
streaming STT -> end of turn), printing partials live and a final line per utterance. ``say`` runs text through the
chunker and piper into a WAV file or the speaker, and reports the time to first audio.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from voice.events import TranscriptPartial
from voice.models import resolve


def _status(text: str, final: bool = False) -> None:
    """Partials overwrite one line on a terminal; piped output gets one line per update."""
    if sys.stdout.isatty():
        sys.stdout.write("\r\033[K" + (text if final else f"... {text}") + ("\n" if final else ""))
    else:
        sys.stdout.write((text if final else f"... {text}") + "\n")
    sys.stdout.flush()


async def transcribe_file(config: Any, path: str) -> list[str]:
    """Play the file through the ears a microphone uses (real-time paced blocks -> the Listener), printing the
    partial transcripts live and a final line per utterance."""
    from audio.sources import WavSource
    from voice.hearing.listener import Listener
    from voice.hearing.stt import SpeechToText
    from voice.hearing.utterance import UtteranceEnded

    stt = SpeechToText.from_config(config)
    listener = Listener.from_config(config, stt)
    source = WavSource(path, block_ms=config.audio.block_ms, tail_silence_ms=config.vad.end_silence_ms + 200)
    finals = []
    async for chunk in source:
        for event in await listener.accept_chunk(chunk.samples, chunk.t):
            if isinstance(event, TranscriptPartial):
                _status(event.text)
            elif isinstance(event, UtteranceEnded):
                text = await event.utterance.final()
                _status(text or "(no words)", final=True)
                finals.append(text)
    if listener.hearing:
        text = await listener.finish()
        _status(text or "(no words)", final=True)
        finals.append(text)
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
    from voice.speaking.chunker import Chunker
    from voice.speaking.tts import TextToSpeech

    tts = TextToSpeech(resolve(config.models.tts, "tts", config.models.cache_dir), config.tts)
    sink: WavSink | SpeakerSink
    if out:
        sink = WavSink(out, tts.sample_rate, realtime=False)
    else:
        sink = SpeakerSink(config.audio.output_device, tts.sample_rate, block_ms=config.audio.block_ms)
    chunker = Chunker.from_config(config.tts)
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
    print(
        f"spoke {stats['audio_s']:.2f} s of audio to {where}; first audio after {stats['first_audio_s'] * 1000:.0f} ms",
        file=sys.stderr,
    )
    return 0
