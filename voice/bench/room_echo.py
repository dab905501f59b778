"""`specvoice bench rooms --echo`: our echo canceller (audio/echo.py) against WebRTC's (audio/webrtc.py) in the
simulated rooms.

The device's speaker stands a hand's width from its microphone and plays a reply (piper), slightly distorted as a
small speaker near its limits is (a mild soft clip); the room carries it to the microphone louder than the user, who
then talks over it from a metre or three away ("double talk"). Both cancellers get the same microphone signal
and the same reference (what was played), block by block, as the listener gives them. Reported per room:
- echo return loss enhancement (ERLE, dB) while only the reply plays, after the first two seconds;
- words Whisper hears in the cleaned echo alone (our own voice taken for the user: a false barge-in), and the
  share of silero VAD windows that call it speech;
- the share of VAD windows that hear the user talking over the reply (a barge-in detected), and the word error
  rate of the user's words (whether it can be understood).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from audio.echo import EchoSuppressor
from audio.frames import SPEECH_RATE
from audio.room import ROOMS, Room, power, to_int16
from audio.vad import Vad
from audio.webrtc import FRAME, WebRtcAudio
from voice.speechset import normalize_words, piper_utterance, voices, wer

REPLY = (
    "The kitchen light is on now, and the heating in the living room is set to a comfortable temperature for "
    "the rest of the evening, so you can relax and enjoy your dinner with the family."
)
USER = "Stop, what time is it in London?"
ECHO_OVER_USER_DB = 6.0  # the speaker is close to the microphone: its echo is louder than the user at a metre
LEARN_S = 2.0  # a canceller's first seconds of playback are not scored: it is still learning the room
BLOCK = SPEECH_RATE // 50


def _speaker(played: np.ndarray) -> np.ndarray:
    """A small speaker near its limits: a mild soft clip of the played signal (full scale comes out 24% low)."""
    x = played.astype(np.float32) / 32768
    return np.tanh(x) / np.tanh(1.0) * 32768


def scene(room: Room, distance_m: float) -> dict[str, Any]:
    """The reply played, its echo at the microphone, and the user talking over its second half."""
    reply = piper_utterance(REPLY, deterministic=True)
    user = voices("espeak-gb")[0].speak(USER).astype(np.float32)
    echo = room.hear(_speaker(reply), room.place(0.12, 90.0, height_m=room.microphone[2]))
    talk_at = len(reply) - len(user) - SPEECH_RATE // 2
    near = np.zeros(len(reply), np.float32)
    near[talk_at : talk_at + len(user)] = room.hear(user, room.place(distance_m))
    echo_level = power(near[talk_at : talk_at + len(user)]) * 10 ** (ECHO_OVER_USER_DB / 10)
    echo *= np.sqrt(echo_level / power(echo))
    return {
        "reference": reply,
        "mic": to_int16(echo + near),
        "echo_only": slice(int(LEARN_S * SPEECH_RATE), talk_at),
        "user": slice(talk_at, talk_at + len(user)),
    }


def cancel(kind: str, mic: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(what the VAD hears, what Whisper hears, the delay in samples) from one canceller, fed block by block."""
    ours = EchoSuppressor(SPEECH_RATE, mode="cancel") if kind == "ours" else None
    webrtc = WebRtcAudio(echo=True, noise=False) if kind == "webrtc" else None
    cleaned, heard = [], []
    for i in range(0, len(mic), BLOCK):
        m, r = mic[i : i + BLOCK], reference[i : i + BLOCK]
        if ours is not None:
            cleaned.append(ours.process(m, r))
            heard.append(ours.linear)
        elif webrtc is not None:
            cleaned.append(webrtc.process(m, r))
            heard.append(cleaned[-1])
    delay = ours.delay_samples if ours is not None else FRAME
    return np.concatenate(cleaned), np.concatenate(heard), delay


def _late(samples: np.ndarray, span: slice, delay: int) -> np.ndarray:
    return samples[span.start + delay : span.stop + delay]


def speech_share(vad_path: str, samples: np.ndarray) -> float:
    """The share of silero VAD windows over ``samples`` whose speech probability is above one half."""
    vad = Vad(vad_path)
    window = vad.model.window
    scores = [vad.model.score(samples[i : i + window]) for i in range(0, len(samples) - window + 1, window)]
    return round(float(np.mean(np.array(scores) > 0.5)), 3) if scores else 0.0


def compare(stt: Any, vad_path: str, distance_m: float = 1.0) -> dict[str, dict[str, dict[str, Any]]]:
    """Per room and canceller: ERLE, the words heard in the echo alone, the user's words over the reply."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for room in ROOMS.values():
        s = scene(room, distance_m)
        for kind in ("ours", "webrtc"):
            cleaned, heard, delay = cancel(kind, s["mic"], s["reference"])
            echo_in, echo_out = s["mic"][s["echo_only"]], _late(cleaned, s["echo_only"], delay)
            leaked = stt.decode(_late(heard, s["echo_only"], delay).astype(np.float32) / 32768)
            user = stt.decode(_late(heard, s["user"], delay).astype(np.float32) / 32768)
            user_text = "".join(w.text for w in user).strip()
            results.setdefault(room.name, {})[kind] = {
                "erle_db": round(10 * float(np.log10(power(echo_in) / max(power(echo_out), 1e-9))), 1),
                "echo_words_heard": len(normalize_words("".join(w.text for w in leaked))),
                "echo_vad_speech": speech_share(vad_path, echo_out),
                "user_vad_speech": speech_share(vad_path, _late(cleaned, s["user"], delay)),
                "user_heard": user_text,
                "user_wer": round(wer(USER, user_text), 3),
            }
    return results


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = [
        f"{'room':14s} {'canceller':9s} {'ERLE dB':>8s} {'echo words':>10s} {'echo VAD':>8s} {'user VAD':>8s} "
        f"{'user WER':>8s}  user heard as"
    ]
    for room, by_kind in results.items():
        for kind, r in by_kind.items():
            lines.append(
                f"{room:14s} {kind:9s} {r['erle_db']:8.1f} {r['echo_words_heard']:10d} {r['echo_vad_speech']:8.0%} "
                f"{r['user_vad_speech']:8.0%} {r['user_wer']:8.2f}  "
                f"{r['user_heard']!r}"
            )
    return "\n".join(lines)
