"""The Realtime API's wire, below the event schemas: JSON with limits, errors, ids, and the audio formats.

Every limit here exists because a client can send anything. JSON is parsed with a depth and size limit (a deeply
nested message raised RecursionError inside ``json.loads``, a 5000-digit number a ValueError; both became
tracebacks), and without NaN or Infinity. Audio comes in three formats: ``audio/pcm`` (16-bit little-endian mono,
24 kHz by default, other common rates as an extension), and G.711 ``audio/pcmu`` / ``audio/pcma`` at 8 kHz (what
telephone gateways send). A connection converts its input with one ``StreamResampler`` for the session, and each
response's audio with one of its own, never chunk by chunk (audio/resample.py says why).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from audio import g711
from audio.frames import SPEECH_RATE
from audio.resample import StreamResampler

WIRE_RATE = 24000  # the Realtime API's audio/pcm rate (its only one; the others are our extension)
PCM_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
FORMATS = ("audio/pcm", "audio/pcmu", "audio/pcma")
MAX_DEPTH = 32  # JSON nesting: a tool's parameter schema needs a handful of levels
MAX_VALUES = 20000  # JSON values in one message (an append is one string; a tool list a few hundred)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class ClientError(Exception):
    """A problem with what the client sent; becomes one ``error`` event, and the session goes on."""

    def __init__(self, code: str, message: str, *, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.event_id = code, message, param, event_id


class _BadNumber(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber(f"the number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise _BadNumber(f"{name} is not a JSON number")


def load_json(text: str) -> Any:
    """JSON text -> Python, or ClientError: bad syntax, NaN/Infinity, over-long numbers, too deep or too big."""
    try:
        raw = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise ClientError(
            "invalid_json", f"the message is nested too deeply; keep JSON nesting under {MAX_DEPTH} levels"
        ) from None
    except _BadNumber as exc:
        raise ClientError(
            "invalid_json", f"the message is not valid JSON for this API: {exc}; send finite numbers"
        ) from None
    except ValueError as exc:  # JSONDecodeError, and int() refusing a number of thousands of digits
        detail = str(exc).split(";")[0][:120]
        raise ClientError(
            "invalid_json", f"the message is not valid JSON ({detail}); send one JSON object per text frame"
        ) from None
    _check_shape(raw)
    return raw


def _check_shape(raw: Any) -> None:
    """Depth and value-count limits, walked without recursion (the cost is one step per value)."""
    stack: list[tuple[Any, int]] = [(raw, 1)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise ClientError(
                "invalid_json", f"the message holds more than {MAX_VALUES} JSON values; send less per event"
            )
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            raise ClientError("invalid_json", f"the message is nested more than {MAX_DEPTH} levels deep; flatten it")
        stack.extend((child, depth + 1) for child in children)


# ---- audio formats -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WireFormat:
    """One of the Realtime audio formats: ``audio/pcm`` at ``rate``, or G.711 at 8 kHz."""

    type: str = "audio/pcm"
    rate: int = WIRE_RATE

    @classmethod
    def parse(cls, kind: str, rate: int | None, param: str) -> WireFormat:
        if kind == "audio/pcm":
            rate = WIRE_RATE if rate is None else rate
            if rate not in PCM_RATES:
                raise ClientError(
                    "unsupported_audio_format",
                    f"audio/pcm at {rate} Hz is not supported; supported "
                    f"rates: {', '.join(map(str, PCM_RATES))} (24000 is the Realtime default)",
                    param=param,
                )
            return cls(kind, rate)
        if kind in ("audio/pcmu", "audio/pcma"):
            if rate not in (None, g711.RATE):
                raise ClientError(
                    "unsupported_audio_format", f"{kind} is G.711 at 8000 Hz only (got rate {rate})", param=param
                )
            return cls(kind, g711.RATE)
        raise ClientError(
            "unsupported_audio_format",
            f"unsupported audio format {kind!r}; supported: {', '.join(FORMATS)}",
            param=param,
        )

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "rate": self.rate} if self.type == "audio/pcm" else {"type": self.type}

    def describe(self) -> str:
        if self.type == "audio/pcm":
            return f"base64 of 16-bit little-endian mono PCM at {self.rate} Hz"
        return f"base64 of G.711 {'u-law' if self.type == 'audio/pcmu' else 'A-law'} bytes at 8000 Hz"

    def decode(self, b64: str) -> np.ndarray:
        """base64 audio in this format -> int16 samples at ``rate``, or ClientError saying what is wrong."""
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise ClientError(
                "invalid_audio", f"audio is not valid base64; send {self.describe()}", param="audio"
            ) from None
        if self.type == "audio/pcmu":
            return g711.ulaw_decode(raw)
        if self.type == "audio/pcma":
            return g711.alaw_decode(raw)
        if len(raw) % 2:
            raise ClientError(
                "invalid_audio",
                f"audio has {len(raw)} bytes, an odd number: pcm16 needs 2 bytes per sample; send {self.describe()}",
                param="audio",
            )
        return np.frombuffer(raw, dtype="<i2").astype(np.int16)

    def encode(self, samples: np.ndarray) -> str:
        """int16 samples at ``rate`` -> base64 in this format."""
        if self.type == "audio/pcmu":
            data = g711.ulaw_encode(samples)
        elif self.type == "audio/pcma":
            data = g711.alaw_encode(samples)
        else:
            data = samples.astype("<i2").tobytes()
        return base64.b64encode(data).decode("ascii")


class AudioIn:
    """A connection's input audio: wire format -> the ears' 16 kHz, through one stream resampler for the session.
    ``received_ms`` is the input's own clock (audio_start_ms / audio_end_ms are on it)."""

    def __init__(self, fmt: WireFormat) -> None:
        self.format = fmt
        self.received = 0  # samples at the wire rate, over the connection's life
        self._resampler = StreamResampler(fmt.rate, SPEECH_RATE)

    @property
    def received_ms(self) -> int:
        return int(self.received * 1000 / self.format.rate)

    def set_format(self, fmt: WireFormat) -> None:
        if fmt != self.format:
            self.received = int(self.received * fmt.rate / self.format.rate)  # keep the clock in milliseconds
            self.format, self._resampler = fmt, StreamResampler(fmt.rate, SPEECH_RATE)

    def decode(self, b64: str) -> np.ndarray:
        wire = self.format.decode(b64)
        self.received += len(wire)
        return self._resampler.push(wire)

    def flush(self) -> np.ndarray:
        """The resampler's held-back tail (a few ms), at the end of a manual buffer; the stream starts afresh."""
        return self._resampler.flush()


class AudioOut:
    """One response's audio: the voice's rate -> the wire format, through one stream resampler for the response.
    ``flush`` gives the tail at the end of a completed response; a cancelled one just drops it."""

    def __init__(self, fmt: WireFormat, voice_rate: int) -> None:
        self.format = fmt
        self._resampler = StreamResampler(voice_rate, fmt.rate)

    def encode(self, samples: np.ndarray) -> str | None:
        out = self._resampler.push(samples)
        return self.format.encode(out) if len(out) else None

    def flush(self) -> str | None:
        out = self._resampler.flush()
        return self.format.encode(out) if len(out) else None
