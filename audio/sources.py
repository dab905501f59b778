"""Where the ears get audio: a WAV file paced like a microphone, or the microphone itself.

Both are async iterators of ``AudioChunk`` blocks (int16 mono at ``rate``) whose ``t`` is the monotonic time
of the first sample, so everything downstream (VAD, latency trace) works the same on files and devices.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import soxr

from audio.device_watch import DeviceWatch, StreamSlot
from audio.devices import DeviceError, find_device
from audio.frames import SPEECH_RATE, AudioChunk
from audio.wavfile import read_wav

log = logging.getLogger("specvoice.audio")


class WavSource:
    """A WAV file delivered in ``block_ms`` blocks. With ``realtime`` each block arrives when a microphone
    would deliver it (just after its last sample), so latencies measured on files mean what they mean on a
    device; without it the blocks come at once but keep the same virtual timestamps.

    ``tail_silence_ms`` appends silence, so a VAD can see the end of the last utterance in the file.
    The file is converted (downmix, resample) to ``rate``: a person handed it to us.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        block_ms: int = 20,
        rate: int = SPEECH_RATE,
        realtime: bool = True,
        tail_silence_ms: int = 0,
    ) -> None:
        samples, _ = read_wav(path, rate, convert=True)
        tail = np.zeros(rate * tail_silence_ms // 1000, dtype=np.int16)
        self.samples = np.concatenate([samples, tail])
        self.rate = rate
        self.block = max(1, rate * block_ms // 1000)
        self.realtime = realtime
        self.start_t: float | None = None  # monotonic time of the first sample, set when iteration starts

    @property
    def duration(self) -> float:
        return len(self.samples) / self.rate

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self._blocks()

    async def _blocks(self) -> AsyncIterator[AudioChunk]:
        t0 = self.start_t = time.monotonic()
        for start in range(0, len(self.samples), self.block):
            block = self.samples[start : start + self.block]
            t = t0 + start / self.rate
            if self.realtime:
                delay = t + len(block) / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let other tasks run, as a real source would
            yield AudioChunk(block, self.rate, t)


class _BlockClock:
    """Timestamps for capture blocks on time.monotonic(), steady despite callback jitter.

    Each callback estimates its block's first-sample time as ``now - age`` (age: PortAudio's current time
    minus the block's ADC time). On PulseAudio that age is right to a few ms most of the time but sometimes
    absurd (0.7 s at start-up), and callbacks come in bursts. So an age beyond ``max_age`` is replaced by the
    block length, and the clock follows the estimates loosely: the next block starts where the last one ended,
    nudged 5% towards the new estimate, and jumps to the estimate only when the two differ by more than two
    blocks (an overflow, a restart).
    """

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self.restart()

    def restart(self) -> None:
        self.next_t: float | None = None

    def stamp(self, now: float, age: float | None, frames: int, rate: int) -> float:
        duration = frames / rate
        if age is None or not 0 <= age <= self.max_age:
            age = duration
        estimate = now - age
        if self.next_t is None or abs(estimate - self.next_t) > 2 * duration:
            t = estimate
        else:
            t = self.next_t + 0.05 * (estimate - self.next_t)
        self.next_t = t + duration
        return t


class MicSource:
    """The microphone through sounddevice. The PortAudio callback never blocks: it copies the block and hands
    it to the event loop with ``call_soon_threadsafe``; a full queue drops the block and counts it in
    ``dropped`` (a stalled consumer must not stall the audio thread).

    If the device refuses ``rate``, it is opened at its default rate and resampled here (not in the callback).
    A microphone unplugged and plugged back is opened again (audio/device_watch.py): the blocks stop while it
    is away and go on when it is back.
    """

    def __init__(
        self,
        device: str | int | None = None,
        *,
        block_ms: int = 20,
        rate: int = SPEECH_RATE,
        max_queued_blocks: int = 100,
        latency: float | str = "low",
    ) -> None:
        self.device = find_device(device, "input")
        self.rate = rate
        self.block_ms = block_ms
        self.dropped = 0
        self.overflows = 0  # PortAudio input overflows (the OS dropped audio before we saw it)
        self._max = max_queued_blocks
        self.latency = latency  # sounddevice's: "low", "high" or seconds of device buffering
        self._queue: asyncio.Queue[tuple[np.ndarray, float, int] | None] | None = None
        self._slot = StreamSlot()  # the sounddevice.InputStream while capturing
        self.watch: DeviceWatch | None = None
        self._closed = False

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        import sounddevice as sd  # imported late: file sources need no PortAudio

        queue = self._queue
        assert queue is not None

        def put(item: tuple[np.ndarray, float, int]) -> None:
            if queue.full():
                self.dropped += 1
            else:
                queue.put_nowait(item)

        clock = _BlockClock(max_age=0.25)

        def opened_at(device_rate: int) -> Callable[..., None]:
            def callback(indata, frames, time_info, status) -> None:  # PortAudio thread: copy, stamp, hand over
                now = time.monotonic()
                if self.watch is not None:
                    self.watch.tick()
                if status.input_overflow:
                    self.overflows += 1
                    clock.restart()
                adc, current = time_info.inputBufferAdcTime, time_info.currentTime
                # PortAudio's stream clock is not monotonic(): map it through the callback's "now"
                t = clock.stamp(now, current - adc if adc > 0 and current > 0 else None, frames, device_rate)
                loop.call_soon_threadsafe(put, (indata[:, 0].copy(), t, device_rate))

            return callback

        default_rate = int(sd.query_devices(self.device, "input")["default_samplerate"])
        error: Exception | None = None
        for device_rate in dict.fromkeys((self.rate, default_rate)):
            try:
                stream = sd.InputStream(
                    device=self.device,
                    samplerate=device_rate,
                    channels=1,
                    dtype="int16",
                    blocksize=device_rate * self.block_ms // 1000,
                    callback=opened_at(device_rate),
                    latency=self.latency,
                )
                stream.start()
                clock.restart()
                self._slot.put(stream)
                return
            except sd.PortAudioError as exc:
                error = exc
                log.info("input device refused a rate", extra={"rate": device_rate, "error": str(exc)})
        raise DeviceError(
            f"cannot open audio input device {self.device!r}: {error}; "
            f"fix: choose another audio.input_device (`python -m sounddevice` lists them)"
        )

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self._blocks()

    async def _blocks(self) -> AsyncIterator[AudioChunk]:
        self._queue = asyncio.Queue(self._max)
        loop = asyncio.get_running_loop()
        self._open(loop)
        self.watch = DeviceWatch("input", 1000 / self.block_ms, reopen=lambda: self._open(loop), close=self._slot.close)
        self.watch.start()
        converters: dict[int, soxr.ResampleStream] = {}  # by device rate: a reopened device may choose another
        try:
            while True:
                item = await self._queue.get()
                if item is None:
                    return
                samples, t, device_rate = item
                if device_rate != self.rate:
                    if device_rate not in converters:
                        converters[device_rate] = soxr.ResampleStream(device_rate, self.rate, 1, dtype="int16")
                    samples = converters[device_rate].resample_chunk(samples)
                yield AudioChunk(samples, self.rate, t)
        finally:
            self.close()

    def close(self) -> None:
        """Stop capturing; a running ``async for`` ends after the blocks already queued."""
        if self._closed:
            return
        self._closed = True
        if self.watch is not None:
            self.watch.stop()  # first: it must not open the device again behind us
        self._slot.close()
        if self._queue is not None:
            if self._queue.full():
                self._queue.get_nowait()  # make room for the end marker
            self._queue.put_nowait(None)
