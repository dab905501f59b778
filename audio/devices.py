"""Audio device listing and selection by name or index (sounddevice / PortAudio).

A device is chosen by index, by exact name, or by a unique case-insensitive substring of its name; anything
else is an error that lists what exists, so a typo in the config is fixed in one step.
"""

from __future__ import annotations

from dataclasses import dataclass


class DeviceError(RuntimeError):
    """An audio device that cannot be found or opened; the message lists the choices."""


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    inputs: int
    outputs: int
    default_rate: float


def list_devices() -> list[Device]:
    import sounddevice as sd  # imported late: PortAudio is only needed where real devices are used

    return [
        Device(i, d["name"], d["max_input_channels"], d["max_output_channels"], d["default_samplerate"])
        for i, d in enumerate(sd.query_devices())
    ]


def _describe(devices: list[Device], kind: str) -> str:
    usable = [d for d in devices if (d.inputs if kind == "input" else d.outputs) > 0]
    if not usable:
        return f"there are no {kind} devices at all (is a sound server or card present?)"
    return "available: " + ", ".join(f"{d.index}: {d.name!r}" for d in usable)


def find_device(spec: str | int | None, kind: str) -> int | None:
    """Resolve ``spec`` (None = the system default, an index, or a name) to a PortAudio device index.

    ``kind`` is "input" or "output"; the device must have channels of that kind.
    """
    if kind not in ("input", "output"):
        raise ValueError("kind must be 'input' or 'output'")
    if spec is None:
        return None
    devices = list_devices()
    has = (lambda d: d.inputs > 0) if kind == "input" else (lambda d: d.outputs > 0)
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()):
        index = int(spec)
        if not 0 <= index < len(devices) or not has(devices[index]):
            raise DeviceError(
                f"audio {kind} device index {index} does not exist or has no {kind} channels; "
                f"fix: set audio.{kind}_device to one of the {_describe(devices, kind)}"
            )
        return index
    exact = [d for d in devices if d.name == spec and has(d)]
    if exact:
        return exact[0].index
    matches = [d for d in devices if spec.lower() in d.name.lower() and has(d)]
    if len(matches) == 1:
        return matches[0].index
    if not matches:
        raise DeviceError(
            f"no audio {kind} device named {spec!r}; "
            f"fix: set audio.{kind}_device to one of the {_describe(devices, kind)}"
        )
    names = ", ".join(f"{d.index}: {d.name!r}" for d in matches)
    raise DeviceError(f"audio {kind} device name {spec!r} is ambiguous ({names}); fix: use the full name or the index")
