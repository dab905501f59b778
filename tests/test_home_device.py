"""`specvoice run` as a home device, for real: one process with the microphone, the speaker and the MQTT bridge,
against a real mosquitto and a private PulseAudio server with two null sinks (no sound card needed):

    room   what the device's microphone hears (its monitor is the device's input; the test plays questions here)
    spk    the device's speaker (the test records its monitor)
    room2, spk2  the same for a second device (wake word, --serve), so the two never hear each other
    room3, spk3  and for a third, with named home devices and the default LLM (spoken commands)

What the device plays is recorded and transcribed with Whisper tiny.en, so "it was spoken" means a listener
could understand it, not that some function was called. The MQTT side is read with the stock mosquitto_sub and
written with mosquitto_pub.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest

from audio.frames import SPEECH_RATE
from voice.hearing.stt import SpeechToText
from voice.models import resolve
from voice.speechset import Voice

from broker import Broker, free_port
from speech import piper, spoken_as, wer

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "specvoice"


def pactl(env: dict[str, str], *args: str) -> None:
    subprocess.run(["pactl", *args], check=True, capture_output=True, env=env, timeout=30)


@pytest.fixture(scope="module")
def pulse_env(tmp_path_factory):
    """The environment of a private PulseAudio server (its own socket; no other PulseAudio is touched)."""
    run = tmp_path_factory.mktemp("pulse")
    env = {
        **os.environ,
        "PULSE_RUNTIME_PATH": str(run),
        "PULSE_STATE_PATH": str(run),
        "PULSE_SERVER": f"unix:{run / 'native'}",
    }
    subprocess.run(
        [
            "pulseaudio",
            "--daemonize=yes",
            "--exit-idle-time=-1",
            "-n",
            "--load=module-null-sink sink_name=spk",
            "--load=module-null-sink sink_name=room",
            "--load=module-null-sink sink_name=spk2",
            "--load=module-null-sink sink_name=room2",
            "--load=module-null-sink sink_name=spk3",
            "--load=module-null-sink sink_name=room3",
            f"--load=module-native-protocol-unix socket={run / 'native'}",
            "--load=module-always-sink",
        ],
        check=True,
        capture_output=True,
        env=env,
        timeout=30,
    )
    for _ in range(100):
        if subprocess.run(["pactl", "info"], capture_output=True, env=env).returncode == 0:
            break
        time.sleep(0.1)
    pactl(env, "set-default-sink", "spk")
    pactl(env, "set-default-source", "room.monitor")
    yield env
    os.kill(int((run / "pid").read_text().split()[0]), signal.SIGTERM)


class Device:
    """The `specvoice run` process, the broker, and everything published under the prefix (mosquitto_sub)."""

    def __init__(
        self,
        workdir: Path,
        pulse_env: dict[str, str],
        *,
        settings: tuple[str, ...] = (),
        serve: bool = False,
        speaker: str = "spk",
        room: str = "room",
    ) -> None:
        """``speaker`` and ``room``: this device's own null sinks (two devices must not hear each other)."""
        self.workdir, self.pulse_env, self.speaker, self.room = workdir, pulse_env, speaker, room
        self.broker = Broker(workdir / "broker")
        self.broker.start()
        self.messages_file = workdir / "messages.txt"
        self.sub = subprocess.Popen(
            [
                "stdbuf",
                "-oL",
                "mosquitto_sub",
                "-h",
                Broker.host,
                "-p",
                str(self.broker.port),
                "-v",
                "-t",
                f"{PREFIX}/#",
                "-t",
                "homeassistant/#",
                "-t",
                "home/#",  # the devices' command topics (tests that name devices)
            ],
            stdout=self.messages_file.open("w"),
            stderr=subprocess.DEVNULL,
        )
        env = {key: value for key, value in pulse_env.items() if not key.startswith("SPECVOICE_")}
        env.update({"PYTHONPATH": str(ROOT), "PULSE_SINK": speaker, "PULSE_SOURCE": f"{room}.monitor"})
        self.log = workdir / "device.log"
        settings = [
            "mqtt.enabled=true",
            f"mqtt.port={self.broker.port}",
            "mqtt.node_id=hometest",
            "audio.input_device=pulse",
            "audio.output_device=pulse",
            "audio.latency=0.25",
            "models.wake_word=",  # the default wake word only where a test is about it (wake_device)
            *settings,
        ]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "voice.app.cli",
                "-c",
                "small",
                *(x for s in settings for x in ("--set", s)),
                "run",
                *(["--serve"] if serve else []),
            ],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )

    def messages(self) -> list[tuple[str, str]]:
        out = []
        for line in self.messages_file.read_text().splitlines():
            topic, _, payload = line.partition(" ")
            out.append((topic.removeprefix(PREFIX + "/"), payload))
        return out

    def wait_for(self, topic: str, predicate=lambda payload: True, *, after: int = 0, timeout: float = 180):
        """The first message on ``topic`` (under the prefix) after the first ``after`` messages that fits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for seen, payload in self.messages()[after:]:
                if seen == topic and predicate(payload):
                    return payload
            assert self.proc.poll() is None, f"the device exited ({self.proc.returncode}): {self.log.read_text()}"
            time.sleep(0.1)
        raise AssertionError(
            f"nothing on {topic} within {timeout}s; got {self.messages()[after:]}\n{self.log.read_text()[-3000:]}"
        )

    def publish(self, topic: str, payload: str) -> None:
        subprocess.run(
            [
                "mosquitto_pub",
                "-h",
                Broker.host,
                "-p",
                str(self.broker.port),
                "-q",
                "1",
                "-t",
                f"{PREFIX}/{topic}",
                "-m",
                payload,
            ],
            check=True,
            timeout=30,
        )

    def record(self) -> Recording:
        return Recording(self.workdir / f"spk-{time.monotonic_ns()}.raw", self.pulse_env, self.speaker)

    def play_in_room(self, samples: np.ndarray) -> None:
        path = self.workdir / "question.wav"
        with wave.open(str(path), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(SPEECH_RATE)
            wav.writeframes(samples.astype(np.int16).tobytes())
        subprocess.run(["paplay", f"--device={self.room}", str(path)], check=True, env=self.pulse_env, timeout=60)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.sub.terminate()
        self.sub.wait(10)
        self.broker.stop()


class Recording:
    """parecord on the speaker's monitor while the block runs; ``samples`` once it ended."""

    def __init__(self, path: Path, env: dict[str, str], speaker: str) -> None:
        self.path, self.env, self.speaker = path, env, speaker

    def __enter__(self) -> Recording:
        self.proc = subprocess.Popen(
            [
                "parecord",
                f"--device={self.speaker}.monitor",
                "--raw",
                "--format=s16le",
                f"--rate={SPEECH_RATE}",
                "--channels=1",
                str(self.path),
            ],
            env=self.env,
        )
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(1.0)  # the device's buffering (audio.latency) and PulseAudio's
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(10)

    @property
    def samples(self) -> np.ndarray:
        return np.frombuffer(self.path.read_bytes(), dtype=np.int16)


def running(dev: Device):
    """The device once it is online on the broker and listening; closed (SIGTERM) after, cleanly."""
    try:
        dev.wait_for("availability", lambda p: p == "online", timeout=300)
        deadline = time.monotonic() + 120
        while "listening;" not in dev.log.read_text():
            assert time.monotonic() < deadline and dev.proc.poll() is None, dev.log.read_text()
            time.sleep(0.1)
        yield dev
    finally:
        dev.close()
    assert dev.proc.returncode == 0, dev.log.read_text()[-3000:]
    assert dev.messages()[-1] == ("availability", "offline")  # said goodbye on SIGTERM


@pytest.fixture(scope="module")
def device(tmp_path_factory, pulse_env):
    yield from running(Device(tmp_path_factory.mktemp("home"), pulse_env))


@pytest.fixture(scope="module")
def wake_device(tmp_path_factory, pulse_env):
    """A second device: wake word "hey jarvis" and, with --serve, the websocket (and /health) and Wyoming."""
    port, wyoming_port = free_port(), free_port()
    dev = Device(
        tmp_path_factory.mktemp("wake"),
        pulse_env,
        serve=True,
        speaker="spk2",
        room="room2",
        settings=("models.wake_word=hey_jarvis", f"server.port={port}", f"wyoming.port={wyoming_port}"),
    )
    dev.http_port, dev.wyoming_port = port, wyoming_port
    yield from running(dev)


@pytest.fixture(scope="module")
def stt(small_config):
    """The test's own ear: tiny.en with a beam of 5, so a word lost to a busy machine's recording is less often
    a word misheard (beam 1 once heard "porch light is" as "porch wide as" in a loaded CI run)."""
    return SpeechToText(resolve(small_config.models.stt, "stt"), small_config.stt.model_copy(update={"beam_size": 5}))


def test_home_assistant_discovers_the_device_entities(device):
    device.wait_for("homeassistant/event/hometest/event/config", timeout=60)
    found = {
        tuple(topic.split("/")[1:4:2])
        for topic, _ in device.messages()
        if topic.startswith("homeassistant/") and topic.endswith("/config") and "/hometest/" in topic
    }
    assert found == {
        ("sensor", "state"),
        ("sensor", "transcript"),
        ("sensor", "reply"),
        ("sensor", "latency"),
        ("sensor", "acceptance"),
        ("text", "say"),
        ("text", "ask"),
        ("notify", "speak"),
        ("button", "stop"),
        ("event", "event"),
    }
    configs = {topic: json.loads(payload) for topic, payload in device.messages() if topic.endswith("/config")}
    assert all(c["origin"]["name"] == "specvoice" and c["device"]["sw_version"] for c in configs.values())


async def test_mqtt_say_is_spoken_on_the_speaker(device, stt):
    text = "The garage door is open and the porch light is still on."
    before = len(device.messages())
    with device.record() as recording:
        device.publish("say", text)
        spoken = json.loads(device.wait_for("spoken", after=before, timeout=120))
    assert spoken["text"] == text and spoken["audio_s"] > 1
    heard = await stt.transcribe(recording.samples)
    assert spoken_as(text, heard), (heard, spoken, len(recording.samples) / SPEECH_RATE)


async def test_mqtt_ask_is_answered_aloud_and_on_the_answer_topic(device, stt):
    before = len(device.messages())
    with device.record() as recording:
        device.publish("ask", json.dumps({"text": "What is the capital of France?", "id": "q1"}))
        answer = json.loads(device.wait_for("answer", lambda p: '"q1"' in p, after=before, timeout=180))
        device.wait_for("state", lambda p: p == "idle", after=before, timeout=120)
    assert answer["id"] == "q1" and answer["reply"].strip()
    heard = await stt.transcribe(recording.samples)
    assert wer(answer["reply"], heard) <= 0.35, (answer["reply"], heard)
    states = [p for topic, p in device.messages()[before:] if topic == "state"]
    assert "thinking" in states and "speaking" in states, states


async def test_local_conversation_is_spoken_and_its_state_reaches_home_assistant(device, stt):
    """A question spoken in the room: the device hears it, answers on its speaker, and the broker sees
    listening -> thinking -> speaking, the transcript, the reply and a turn_end event."""
    question = "What is the capital of France?"
    before = len(device.messages())
    with device.record() as recording:
        device.play_in_room(piper(question))
        reply = json.loads(device.wait_for("reply", after=before, timeout=180))
        device.wait_for("state", lambda p: p == "idle", after=before, timeout=120)
    transcript = json.loads(device.wait_for("transcript", after=before, timeout=5))
    # the transcript is the device's own (tiny.en, live): under CPU load its first words can slip, as in
    # "But as the capital of France..." (seen once in a full-suite run); the content words must be there
    assert wer(question, transcript["text"]) <= 0.4 and "capital of france" in transcript["text"].lower(), transcript
    states = [p for topic, p in device.messages()[before:] if topic == "state"]
    order = [s for s in states if s in ("listening", "thinking", "speaking")]
    assert order[:1] == ["listening"] and "thinking" in order and order.index("thinking") < order.index("speaking")
    device.wait_for("event", lambda p: "turn_end" in p, after=before, timeout=30)
    heard = await stt.transcribe(recording.samples)
    # tiny.en hearing the reply back mangles names and foreign words, often as two words for one: "Lagrant pairs"
    # for "Le Grand Paris" (0.375 on 8 words), "One jur, one jur" for the small model's "Bonjour, bonjour" (0.5 on
    # 8). So most of it (a silent, doubled or halved reply is far off)
    assert reply["text"].strip() and wer(reply["text"], heard) <= 0.5, (reply["text"], heard)


async def test_wake_word_and_servers_in_the_same_process(wake_device, stt):
    """`run --serve` with a wake word: /health answers ready, Wyoming listens, "hey jarvis" spoken in the room
    fires the Home Assistant event entity, and an MQTT say is still heard on the speaker."""
    with urllib.request.urlopen(f"http://127.0.0.1:{wake_device.http_port}/health", timeout=30) as response:
        assert response.status == 200 and json.loads(response.read())["status"] == "ready"
    with socket.create_connection(("127.0.0.1", wake_device.wyoming_port), timeout=30):
        pass
    before = len(wake_device.messages())
    wake_device.play_in_room(np.concatenate([piper("Hey Jarvis."), np.zeros(SPEECH_RATE, dtype=np.int16)]))
    event = json.loads(wake_device.wait_for("event", lambda p: "wake_word" in p, after=before, timeout=60))
    assert event["event_type"] == "wake_word" and "jarvis" in json.dumps(event)
    settled(wake_device)  # whatever the wake started has been said: the recording below holds the say alone
    text = "The washing machine has finished."
    before = len(wake_device.messages())
    with wake_device.record() as recording:
        wake_device.publish("say", text)
        wake_device.wait_for("spoken", after=before, timeout=120)
    heard = await stt.transcribe(recording.samples)
    assert spoken_as(text, heard), heard


def settled(dev: Device, quiet_s: float = 1.5, timeout: float = 120) -> None:
    """Until the device's last state is idle and nothing new was published for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = dev.messages()
        states = [payload for topic, payload in seen if topic == "state"]
        time.sleep(quiet_s)
        if states and states[-1] == "idle" and len(dev.messages()) == len(seen):
            return
    raise AssertionError(f"the device did not settle within {timeout}s: {dev.messages()[-10:]}")


# ---- home commands: a spoken request through the device, the default LLM, and the allow-list ----------------

HOME_DEVICES = (
    'mqtt.devices=[{name = "bedroom lamp", topic = "home/bedroom/lamp/set", payloads = ["ON", "OFF"], '
    'area = "bedroom"}, {name = "kitchen light", topic = "home/kitchen/light/set", payloads = ["ON", "OFF"], '
    'area = "kitchen"}]'
)
REFUSAL = re.compile(r"\b(can't|cannot|can not|unable|not able|don't have|do not have|no device|isn't|not on)\b")


@pytest.fixture(scope="module")
def home_device(tmp_path_factory, pulse_env):
    """A third device: two named devices, and the default LLM (the small one cannot act), so a command is
    decided by the model the product ships with."""
    dev = Device(
        tmp_path_factory.mktemp("homecmd"),
        pulse_env,
        speaker="spk3",
        room="room3",
        settings=(HOME_DEVICES, "models.target=qwen2.5-coder-1.5b-instruct", "llm.max_new_tokens=64"),
    )
    yield from running(dev)


def commands(dev: Device, after: int) -> list[tuple[str, str]]:
    return [(topic, payload) for topic, payload in dev.messages()[after:] if topic.startswith("home/")]


def ask_aloud(dev: Device, question: str) -> tuple[int, dict]:
    before = len(dev.messages())
    dev.play_in_room(piper(question))
    reply = json.loads(dev.wait_for("reply", after=before, timeout=180))
    dev.wait_for("state", lambda p: p == "idle", after=before, timeout=120)
    time.sleep(1.0)  # a late, second publish would land by now
    return before, reply


def test_a_spoken_command_publishes_exactly_that_command_once(home_device):
    before, reply = ask_aloud(home_device, "Turn off the bedroom lamp.")
    transcript = json.loads(home_device.wait_for("transcript", after=before, timeout=5))
    assert "bedroom lamp" in transcript["text"].lower(), transcript
    assert commands(home_device, before) == [("home/bedroom/lamp/set", "OFF")], (reply, home_device.messages()[before:])
    assert reply["text"].strip() and "[ACTION" not in reply["text"], reply


def test_a_device_not_on_the_list_publishes_nothing_and_says_so(home_device):
    before, reply = ask_aloud(home_device, "Turn on the garage heater.")
    assert commands(home_device, before) == [], (reply, home_device.messages()[before:])
    assert REFUSAL.search(reply["text"].lower()), reply


def test_a_device_named_without_a_value_is_asked_back_and_the_spoken_answer_does_it(home_device):
    """No sentence of Home Assistant's matches a device named alone ("Kitchen light, please."): whatever the model
    proposes is asked back, nothing is published until the answer, and the answer alone ("Turn it on.") commands
    the device asked about, once."""
    before, reply = ask_aloud(home_device, "Kitchen light, please.")
    assert commands(home_device, before) == [], (reply, home_device.messages()[before:])
    assert reply["text"].strip().startswith("Do you want the kitchen light"), reply
    before, reply = ask_aloud(home_device, "Turn it on.")
    assert commands(home_device, before) == [("home/kitchen/light/set", "ON")], (reply, home_device.messages()[before:])
    # heard without its verb, a command may be a question that lost its first word: confirmed first
    before, reply = ask_aloud(home_device, "Kitchen light off.")
    assert commands(home_device, before) == [], (reply, home_device.messages()[before:])
    assert reply["text"].strip() == "Do you want the kitchen light off?", reply
    before, reply = ask_aloud(home_device, "Yes, please.")
    published = home_device.messages()[before:]
    assert commands(home_device, before) == [("home/kitchen/light/set", "OFF")], (reply, published)


def test_an_answer_heard_as_other_words_is_chosen_among_the_answers_the_question_allows(home_device):
    """In espeak-ng's Caribbean voice tiny.en heard "Turn it on, please." as "Tommy tongue, please." in every
    `bench home` run: after a question back, the device scores the answers it allows against the audio
    (voice/dialog/rehearing.py) and the one that fits does what was asked, once."""
    before, reply = ask_aloud(home_device, "Bedroom lamp, please.")
    assert reply["text"].strip().startswith("Do you want the bedroom lamp"), reply
    before = len(home_device.messages())
    home_device.play_in_room(Voice("espeak-caribbean", "espeak", "en-029", 150).speak("Turn it on, please."))
    reply = json.loads(home_device.wait_for("reply", after=before, timeout=180))
    home_device.wait_for("state", lambda p: p == "idle", after=before, timeout=120)
    time.sleep(1.0)
    transcript = json.loads(home_device.wait_for("transcript", after=before, timeout=5))  # the words chosen
    published = home_device.messages()[before:]
    assert commands(home_device, before) == [("home/bedroom/lamp/set", "ON")], (transcript, reply, published)
