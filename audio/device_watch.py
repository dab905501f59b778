"""A sound device that stops delivering is opened again: the watch behind MicSource and SpeakerSink.

A USB microphone or speaker pulled out, or a PulseAudio sink unloaded, does not make PortAudio raise on a
callback stream. Its callbacks thin out or stop, and when the device comes back the old stream stays nearly
silent: only a new stream hears it again. So a daemon thread counts the stream's callbacks; when fewer than a
half of the blocks the device should deliver arrive in two checks running, the stream is closed and opened
again, then retried with a growing pause while the device is away. The owner is told when the device is lost
(a speaker then drops what it would play: nobody can hear it, and a reply must not wait for it) and when it is
back.

PortAudio lists its devices once, when it starts: a device that comes back under a new index is not seen
until the process restarts (systemd's Restart= does that). PulseAudio's and PipeWire's ALSA devices keep
their place, so a device chosen through them (``pulse``, ``default``) is found again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("specvoice.audio")

CHECK_S = 1.0  # how often the callbacks are counted
LOW_SHARE = 0.5  # fewer than this share of the expected blocks is a check "low"
LOW_CHECKS = 2  # this many low checks running mean the device is gone (one low check can be a busy machine)
START_GRACE_S = 5.0  # a stream just opened: PulseAudio can take a couple of seconds before its first callback
RETRY_S = (0.5, 1.0, 2.0, 5.0)  # pauses between tries to open the device again (the last one repeats)


class DeviceWatch:
    """Counts a stream's callbacks (``tick``, from the PortAudio thread) and reopens the stream when they stop.

    ``reopen`` opens a new stream (raising when the device is still away); ``close`` closes the current one.
    Both run on the watch's thread, so the owner guards its stream with a lock. ``on_lost`` / ``on_back`` tell
    the owner; ``lost`` says the device is away now and ``recoveries`` how often it came back."""

    def __init__(
        self,
        what: str,
        blocks_per_s: float,
        *,
        reopen: Callable[[], None],
        close: Callable[[], None],
        on_lost: Callable[[], None] = lambda: None,
        on_back: Callable[[], None] = lambda: None,
    ) -> None:
        self.what = what
        self.blocks_per_s = blocks_per_s
        self.blocks = 0
        self.lost = False
        self.recoveries = 0
        self._reopen, self._close, self._on_lost, self._on_back = reopen, close, on_lost, on_back
        self._opened_t = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{what} watch", daemon=True)

    def start(self) -> None:
        self._opened_t = time.monotonic()
        self._thread.start()

    def tick(self) -> None:
        """One callback of the stream (called on the PortAudio thread; an int add under the GIL)."""
        self.blocks += 1

    def stop(self) -> None:
        """End the watch; waits for a reopen under way, so the owner may close the stream afterwards."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        seen, low = self.blocks, 0
        while not self._stop.wait(CHECK_S):
            arrived, seen = self.blocks - seen, self.blocks
            if time.monotonic() - self._opened_t < START_GRACE_S:
                low = 0
                continue
            low = low + 1 if arrived < LOW_SHARE * self.blocks_per_s * CHECK_S else 0
            if low >= LOW_CHECKS:
                self._recover()
                seen, low = self.blocks, 0

    def _recover(self) -> None:
        log.warning("audio device stopped delivering (unplugged?): opening it again", extra={"device": self.what})
        self.lost = True
        self._on_lost()
        with contextlib.suppress(Exception):  # a stream whose device vanished may refuse to close cleanly
            self._close()
        tries = 0
        while not self._stop.is_set():
            try:
                self._reopen()
            except Exception as exc:  # the device is still away (DeviceError, PortAudioError)
                log.debug("audio device not back yet", extra={"device": self.what, "error": str(exc)})
                self._stop.wait(RETRY_S[min(tries, len(RETRY_S) - 1)])
                tries += 1
                continue
            self._opened_t = time.monotonic()
            self.lost = False
            self.recoveries += 1
            log.warning("audio device is back", extra={"device": self.what, "tries": tries + 1})
            self._on_back()
            return


class StreamSlot:
    """The PortAudio stream a source or sink has now. The event loop and the watch's thread both open and close
    it, so it is swapped under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stream: Any = None  # a started sounddevice stream, or None

    def put(self, stream: Any) -> None:
        with self._lock:
            self.stream = stream

    def close(self) -> None:
        with self._lock:
            stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(Exception):  # PortAudio may have ended it already (its device gone)
                stream.stop()
            stream.close(ignore_errors=True)
