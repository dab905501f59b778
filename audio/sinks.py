"""Where the mouth sends audio: the speaker (sounddevice) or a WAV file paced like a speaker.

Both share one buffer design. ``write`` queues int16 samples (waiting while more than ``max_buffer_s`` is
queued, so a fast TTS cannot run far ahead); the device side pulls one block at a time. ``flush`` empties the
queue, so after a barge-in at most the block already handed to the device is heard. The sink records every
block it hands over with its play time (a "reference" ring): the echo canceller needs the exact played signal.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from audio.device_watch import DeviceWatch, StreamSlot
from audio.devices import DeviceError, find_device
from audio.wavfile import write_wav


@runtime_checkable
class AudioSink(Protocol):
    """Where a reply's audio goes. Every sink can say how much of the current utterance the listener has heard
    (``heard_samples``): after a barge-in the history keeps exactly those words, whatever the transport."""

    @property
    def sample_rate(self) -> int: ...
    @property
    def first_audible_t(self) -> float | None: ...  # monotonic time the utterance's first sample sounded
    @property
    def played_samples(self) -> int: ...  # samples of the utterance handed to the device so far

    async def write(self, samples: np.ndarray) -> None: ...
    def flush(self) -> None: ...
    async def drain(self) -> None: ...
    def begin_utterance(self) -> None: ...
    def heard_samples(self) -> int: ...


@runtime_checkable
class HoldableSink(AudioSink, Protocol):
    """A sink that can go quiet without losing what is queued. A backchannel ("mhm", a cough) during a reply
    holds it, and if that is all it was, the reply goes on from the sample where it stopped; a real
    interruption flushes it as usual (``flush`` also ends a hold)."""

    def hold(self) -> None: ...
    def release(self) -> None: ...


class _BufferedSink:
    """The queue between ``write`` (event loop) and the block pump (a device thread or a timer task)."""

    def __init__(self, sample_rate: int, block_ms: int, max_buffer_s: float, reference_s: float) -> None:
        self.sample_rate = sample_rate
        self.block = max(1, sample_rate * block_ms // 1000)
        self.block_s = self.block / sample_rate
        self.first_audible_t: float | None = None
        self.played_samples = 0
        self.flushes = 0
        self._lock = threading.Lock()
        self._queue: collections.deque[np.ndarray] = collections.deque()
        self._queued = 0
        self._max_queued = int(max_buffer_s * sample_rate)
        self._reference: collections.deque[tuple[float, np.ndarray]] = collections.deque(
            maxlen=max(1, int(reference_s / self.block_s))
        )
        self.last_play_end = 0.0  # monotonic time the last non-silent sample handed over finishes playing
        self.last_filled = 0  # how many samples of the last pulled block were real audio (the rest is padding)
        self.held = False  # hold(): the device gets silence and the queue waits, untouched, for release()

    @property
    def queued_samples(self) -> int:
        return self._queued

    def heard_samples(self) -> int:
        """Samples of the current utterance that have sounded by now: handed to the device and past their play
        time (the device's own buffer is ahead of the listener by ``last_play_end - now``)."""
        with self._lock:
            ahead = max(0.0, self.last_play_end - time.monotonic())
            return max(0, self.played_samples - int(ahead * self.sample_rate))

    def begin_utterance(self) -> None:
        with self._lock:
            self.first_audible_t = None
            self.played_samples = 0

    def flush(self) -> None:
        with self._lock:
            self._queue.clear()
            self._queued = 0
            self.first_audible_t = None
            self.held = False
            self.flushes += 1

    def hold(self) -> None:
        with self._lock:
            self.held = True

    def release(self) -> None:
        with self._lock:
            self.held = False

    async def write(self, samples: np.ndarray) -> None:
        samples = np.asarray(samples)
        if samples.dtype != np.int16 or samples.ndim != 1:
            raise ValueError(f"sinks take 1-D int16 samples (got {samples.dtype}, shape {samples.shape})")
        while self._queued > self._max_queued:
            await asyncio.sleep(self.block_s / 2)
        self._enqueue(samples)

    def _enqueue(self, samples: np.ndarray) -> None:
        if len(samples):
            with self._lock:
                self._queue.append(samples)
                self._queued += len(samples)

    def _pull(self, n: int, play_t: float) -> np.ndarray:
        """Take up to ``n`` queued samples (zero-padded) that start playing at monotonic ``play_t``."""
        out = np.zeros(n, dtype=np.int16)
        with self._lock:
            filled = 0
            while filled < n and self._queue and not self.held:
                head = self._queue[0]
                take = min(n - filled, len(head))
                out[filled : filled + take] = head[:take]
                filled += take
                if take == len(head):
                    self._queue.popleft()
                else:
                    self._queue[0] = head[take:]
            self._queued -= filled
            self.last_filled = filled
            if filled:
                if self.first_audible_t is None:
                    self.first_audible_t = play_t
                self.played_samples += filled
                self.last_play_end = play_t + filled / self.sample_rate
            self._reference.append((play_t, out))
        return out

    def played_reference(self, t0: float, t1: float) -> np.ndarray:
        """The exact samples played between monotonic times ``t0`` and ``t1`` (silence where nothing played or
        the ring no longer reaches back), at ``sample_rate``."""
        n = max(0, int(round((t1 - t0) * self.sample_rate)))
        out = np.zeros(n, dtype=np.int16)
        with self._lock:
            blocks = list(self._reference)
        for start_t, block in blocks:
            offset = int(round((start_t - t0) * self.sample_rate))
            lo, hi = max(0, offset), min(n, offset + len(block))
            if lo < hi:
                out[lo:hi] = block[lo - offset : hi - offset]
        return out


class WavSink(_BufferedSink):
    """Plays into a WAV file (or nowhere, with ``path=None``). With ``realtime`` a loop timer pulls one block
    every ``block_ms``, exactly like a device callback, so timings (first audible sample, flush) behave as on
    a speaker; without it, written audio counts as played at once (so there is nothing to hold). The file gets
    the samples that were played (not the idle gaps between them) and is written by ``close()``."""

    def __init__(
        self,
        path: str | Path | None,
        sample_rate: int,
        *,
        realtime: bool = True,
        block_ms: int = 20,
        max_buffer_s: float = 2.0,
        reference_s: float = 30.0,
    ) -> None:
        super().__init__(sample_rate, block_ms, max_buffer_s, reference_s)
        self.path = Path(path) if path is not None else None
        self.realtime = realtime
        self.played: list[np.ndarray] = []
        self._tick: asyncio.Handle | None = None  # the next block's pull; None while idle

    async def write(self, samples: np.ndarray) -> None:
        if not self.realtime:
            samples = np.asarray(samples)
            if samples.dtype != np.int16 or samples.ndim != 1:
                raise ValueError(f"sinks take 1-D int16 samples (got {samples.dtype}, shape {samples.shape})")
            if len(samples):
                now = time.monotonic()
                with self._lock:
                    if self.first_audible_t is None:
                        self.first_audible_t = now
                    self.played_samples += len(samples)
                    self._reference.append((now, samples.copy()))
                self.played.append(samples.copy())
            return
        if self._tick is None:
            self._tick = asyncio.get_running_loop().call_soon(self._pump, None)
        await super().write(samples)

    def _pump(self, t: float | None) -> None:
        """Pull the block due at ``t`` (monotonic, the loop's clock; None: now) and schedule the next; idle
        (nothing queued, no hold) stops until the next write starts it again. A timer, not a task: nothing is
        left running to await."""
        t = time.monotonic() if t is None else t
        block = self._pull(self.block, t)
        if self.last_filled == 0 and not self.held:
            self._tick = None
            return
        self.played.append(block[: self.last_filled])
        self._tick = asyncio.get_running_loop().call_at(t + self.block_s, self._pump, t + self.block_s)

    async def drain(self) -> None:
        while self._tick is not None:
            await asyncio.sleep(self.block_s / 2)
        await asyncio.sleep(max(0.0, self.last_play_end - time.monotonic()))

    @property
    def audio(self) -> np.ndarray:
        """Everything played so far, concatenated."""
        return np.concatenate(self.played) if self.played else np.zeros(0, dtype=np.int16)

    def close(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self.path is not None:
            write_wav(self.path, self.audio, self.sample_rate)


class SpeakerSink(_BufferedSink):
    """The speaker through a sounddevice OutputStream whose callback pulls one block from the queue.

    ``latency`` (sounddevice's: "low", "high" or seconds) is the device's own buffering on top of one block:
    "low" makes barge-in quickest; raise it when a busy machine makes playback crackle (``underflows``).
    If the device refuses ``sample_rate`` it is opened at its default rate, and ``self.sample_rate`` says so:
    callers resample to ``sink.sample_rate`` (audio.resample) before writing.

    A speaker unplugged and plugged back is opened again (audio/device_watch.py). While it is away, what is
    written is dropped and ``drain`` returns at once: nobody can hear it, and a reply must not wait for it.
    """

    def __init__(
        self,
        device: str | int | None = None,
        sample_rate: int = 22050,
        block_ms: int = 20,
        max_buffer_s: float = 2.0,
        reference_s: float = 30.0,
        latency: float | str = "low",
    ) -> None:
        import sounddevice as sd  # imported late: WavSink needs no PortAudio

        self.device = find_device(device, "output")
        self.underflows = 0
        self.watch: DeviceWatch | None = None
        self._latency_setting = latency
        self._slot = StreamSlot()
        default_rate = int(sd.query_devices(self.device, "output")["default_samplerate"])
        error: Exception | None = None
        for rate in dict.fromkeys((sample_rate, default_rate)):
            super().__init__(rate, block_ms, max_buffer_s, reference_s)
            try:
                stream = self._open_stream()
                break
            except sd.PortAudioError as exc:
                error = exc
        else:
            raise DeviceError(
                f"cannot open audio output device {self.device!r}: {error}; "
                f"fix: choose another audio.output_device (`python -m sounddevice` lists them)"
            )
        self.latency = float(stream.latency)
        self.device_lead = self.latency
        stream.start()
        self._slot.put(stream)
        self.watch = DeviceWatch(
            "output", 1 / self.block_s, reopen=self._reopen, close=self._slot.close, on_lost=self.flush
        )
        self.watch.start()

    def _open_stream(self):
        import sounddevice as sd

        return sd.OutputStream(
            device=self.device,
            samplerate=self.sample_rate,
            channels=1,
            dtype="int16",
            blocksize=self.block,
            callback=self._callback,
            latency=self._latency_setting,
        )

    def _reopen(self) -> None:
        stream = self._open_stream()
        stream.start()
        self._slot.put(stream)

    @property
    def lost(self) -> bool:
        """The device is away (unplugged): writes are dropped until it is back."""
        return self.watch is not None and self.watch.lost

    def _callback(self, outdata, frames, time_info, status) -> None:  # PortAudio thread: never blocks for long
        if self.watch is not None:
            self.watch.tick()
        if status.output_underflow:
            self.underflows += 1
        now = time.monotonic()
        dac = time_info.outputBufferDacTime
        ahead = dac - time_info.currentTime if dac > 0 and time_info.currentTime > 0 else self.latency
        if not 0 <= ahead <= 1.0:  # PulseAudio sometimes reports nonsense; the nominal latency is close
            ahead = self.latency
        self.device_lead = ahead  # how far ahead of "now" the block being filled will sound
        outdata[:, 0] = self._pull(frames, now + ahead)

    async def write(self, samples: np.ndarray) -> None:
        if self.lost:
            return  # the speaker is away: nobody would hear it (the watch emptied the queue when it went)
        await super().write(samples)

    async def drain(self) -> None:
        while self._queued > 0 and not self.lost:
            await asyncio.sleep(self.block_s / 2)
        if not self.lost:
            await asyncio.sleep(max(0.0, self.last_play_end - time.monotonic()))

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()  # first: it must not open the device again behind us
        self._slot.close()
