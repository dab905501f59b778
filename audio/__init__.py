"""specvoice.audio: capture, playback, VAD, resampling and WAV files. Never imports voice."""

from audio.devices import DeviceError, find_device, list_devices
from audio.frames import AudioChunk, to_float32, to_int16
from audio.resample import resample
from audio.sinks import AudioSink, SpeakerSink, WavSink
from audio.sources import MicSource, WavSource
from audio.vad import Vad, VadEvent
from audio.wavfile import WavFormatError, read_wav, write_wav

__all__ = [
    "AudioChunk",
    "AudioSink",
    "DeviceError",
    "MicSource",
    "SpeakerSink",
    "Vad",
    "VadEvent",
    "WavFormatError",
    "WavSink",
    "WavSource",
    "find_device",
    "list_devices",
    "read_wav",
    "resample",
    "to_float32",
    "to_int16",
    "write_wav",
]
