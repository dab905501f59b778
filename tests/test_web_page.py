"""The web page at ``/``, in a real browser: Debian's Chromium, headless, driven by selenium, with a WAV file as
its microphone, talking to `serve()` on the small real models.

Firefox (Debian's firefox-esr) runs the page too, driven over WebDriver BiDi, which Firefox speaks itself (no
geckodriver); its fake microphone is a tone, so there it streams the microphone and answers a typed turn.

What a person would check: the page shows the transcript of what was said and the reply as it streams, the
reply is heard (the page's player counts the non-silent samples it hands to the speakers), speaking over a
reply silences it and tells the server how much was heard, and the latency waterfall is drawn. Screenshots go
to bench-results/web-page/ (git-ignored); the voice-to-voice figure is printed (pytest -s).

Also here, without a browser: the page's files and headers, and the token by subprotocol (the Realtime
convention for browsers, which cannot set an Authorization header).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from audio.wavfile import write_wav
from voice.assistant import Assistant
from voice.speechset import espeak_utterance, wer
from voice.transports.common import SessionSlots, Shared
from voice.transports.realtime.server import RealtimeServer
from voice.transports.realtime.wire import WIRE_RATE

from broker import free_port
from serving import serving

CHROMIUM = "/usr/lib/chromium/chromium"  # not /usr/bin/chromium: its wrapper script prints shell noise
CHROMEDRIVER = "/usr/bin/chromedriver"
FIREFOX = "firefox-esr"
ARTEFACTS = Path(__file__).resolve().parent.parent / "bench-results" / "web-page"
TOKEN = "page-test-token"


@pytest.fixture(scope="module")
def assistant(small_config):
    return Assistant.load_sync(small_config)


def make_config(base, **server: Any):
    config = base.model_copy(deep=True)
    config.server.port = free_port()
    config.wyoming.enabled = False
    for key, value in server.items():
        setattr(config.server, key, value)
    return config


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


# ---- serving and auth, no browser ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def bare_server(config) -> Any:
    """The websocket server's HTTP side alone: serving the page needs no models and no session."""
    from voice.metrics import Metrics

    server = RealtimeServer(Shared(config, None, Metrics(), SessionSlots(1)))
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop(0)


async def test_page_files_are_served_with_their_types_and_a_same_origin_policy(small_config):
    config = make_config(small_config, token=TOKEN)
    async with bare_server(config) as base:
        status, headers, body = await asyncio.to_thread(get, base + "/")
        assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
        assert b'<script type="module" src="app.js">' in body
        csp = headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert f"ws://127.0.0.1:{config.server.port}" in csp and "unsafe" not in csp
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert (await asyncio.to_thread(get, base + "/index.html"))[2] == body
        for name, kind in [
            ("app.js", "text/javascript"),
            ("worklet.js", "text/javascript"),
            ("waterfall.js", "text/javascript"),
            ("style.css", "text/css"),
            ("icon.svg", "image/svg+xml"),
        ]:
            status, headers, body = await asyncio.to_thread(get, f"{base}/{name}")
            assert status == 200 and headers["Content-Type"].startswith(kind) and body, name
            assert int(headers["Content-Length"]) == len(body)
        # nothing else: not the package's Python, not a path out of the folder, not a folder
        for path in [
            "/__init__.py",
            "/../server.py",
            "/..%2fserver.py",
            "/%2e%2e/config.py",
            "/voice/web/app.js",
            "/app.js/",
            "/web/",
            "/.",
            "/nothing.js",
        ]:
            status, _, body = await asyncio.to_thread(get, base + path)
            assert status == 404, path
            assert b"import" not in body, path
        # the metrics endpoint still wants its token; the page itself holds no secret and needs none
        assert (await asyncio.to_thread(get, base + "/metrics"))[0] == 401


async def test_token_by_subprotocol_selects_realtime(assistant):
    config = make_config(assistant.config, token=TOKEN)
    async with serving(config, assistant):
        url = f"ws://127.0.0.1:{config.server.port}/v1/realtime"
        async with connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"]) as ws:
            assert ws.subprotocol == "realtime"
            assert json.loads(await ws.recv())["type"] == "session.created"
        async with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            assert ws.subprotocol is None  # none offered, none selected: header clients unchanged
            assert json.loads(await ws.recv())["type"] == "session.created"
        async with connect(url, subprotocols=["realtime", "openai-insecure-api-key.wrong"]) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            assert "subprotocol" in closed.value.rcvd.reason


# ---- the browser -----------------------------------------------------------------------------------------------


def utterance_wav(path: Path, parts: list[tuple[str, float]]) -> Path:
    """A 16-bit 24 kHz WAV: ~1 s of silence (Chromium may drop the first 10-20 ms), then each (text, silence
    after it in seconds). 16-bit because a 24-bit WAV gave a silent microphone with no error."""
    audio = [np.zeros(WIRE_RATE, np.int16)]
    for text, pause in parts:
        audio += [espeak_utterance(text, WIRE_RATE), np.zeros(int(pause * WIRE_RATE), np.int16)]
    write_wav(path, np.concatenate(audio), WIRE_RATE)
    return path


@contextlib.contextmanager
def chromium(microphone: Path, profile: Path) -> Iterator[Any]:
    """Headless Chromium whose microphone is ``microphone`` (played once, then silence)."""
    need(CHROMIUM, "chromium")
    need(CHROMEDRIVER, "chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [
        "--headless=new",
        "--no-sandbox",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone}%noloop",
        "--autoplay-policy=no-user-gesture-required",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1200,800",
        "--force-device-scale-factor=1",
    ]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def page_state(driver) -> dict[str, Any]:
    return driver.execute_script("return JSON.parse(JSON.stringify(window.specvoice))")


def wait_for(driver, what: str, check, timeout: float = 150.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        state = page_state(driver)
        if check(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the page never showed {what} in {timeout:g} s; its state: "
                f"{json.dumps({k: v for k, v in state.items() if k != 'traces'})[:2000]}"
            )
        time.sleep(0.25)


def texts(driver, selector: str) -> list[str]:
    return driver.execute_script(
        f"return [...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)"
    )


def need(program: str, package: str) -> None:
    """Fail, naming the fix, where the browser is not installed (make system-deps installs it): a skipped
    browser test would pass for a page nobody opened."""
    if shutil.which(program) or os.path.exists(program):
        return
    pytest.fail(f"Debian's {package} is needed: apt-get install {package} (make system-deps)")


def severe_console(driver) -> list[str]:
    """JavaScript errors and CSP violations the page logged."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_page(driver, port: int) -> None:
    driver.get(f"http://127.0.0.1:{port}/#token={TOKEN}")
    assert "token" not in driver.current_url  # the page took it out of the address bar
    driver.find_element("id", "start").click()  # a real click: also the user gesture audio needs


async def test_browser_page_hears_the_question_and_plays_the_reply(assistant, tmp_path):
    question = "What is the weather like today?"
    wav = utterance_wav(tmp_path / "question.wav", [(question, 2.0)])
    config = make_config(assistant.config, token=TOKEN)

    def talk() -> dict[str, Any]:
        with chromium(wav, tmp_path / "profile") as driver:
            open_page(driver, config.server.port)
            state = wait_for(
                driver,
                "a finished turn with its latency",
                lambda s: (
                    s["trace"] is not None and s["replies"] and s["playedFrames"] > 0 and s["status"] == "listening"
                ),
            )
            ARTEFACTS.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(ARTEFACTS / "page.png"))
            driver.find_element("id", "waterfall").screenshot(str(ARTEFACTS / "waterfall.png"))
            state["shown"] = {
                "user": texts(driver, ".turn.user .text"),
                "assistant": texts(driver, ".turn.assistant .text"),
                "v2v": driver.find_element("id", "v2v").text,
                "stages": driver.execute_script(
                    "return [...document.querySelectorAll('#waterfall-svg g.row')].map(g => g.dataset.stage)"
                ),
            }
            state["console"] = severe_console(driver)
            return state

    started = time.monotonic()
    async with serving(config, assistant):
        state = await asyncio.to_thread(talk)
    v2v = state["trace"]["stages_ms"]["voice_to_voice"]
    print(
        f"\nbrowser turn: heard {state['transcript']!r}, replied {state['reply']!r}; voice-to-voice {v2v:.0f} ms "
        f"(server trace), browser playout {state['playoutMs']} ms; {state['nonSilentFrames']} non-silent of "
        f"{state['playedFrames']} samples played at {state['outputRate']} Hz; {time.monotonic() - started:.1f} s; "
        f"screenshots in {ARTEFACTS}"
    )

    assert state["errors"] == [] and state["console"] == [], (state["errors"], state["console"])
    assert state["micSamplesSent"] >= 2 * WIRE_RATE  # the microphone streamed at 24 kHz
    # what was said, on the page (WER-tolerant: whisper tiny.en on espeak)
    assert wer(question, state["transcript"]) <= 0.34, state["transcript"]
    assert state["shown"]["user"] == [state["transcript"]]
    # the reply: text on the page, audio played (at least 0.3 s of it audible)
    assert state["reply"].strip() and state["shown"]["assistant"] == [state["reply"]]
    assert state["nonSilentFrames"] >= 0.3 * state["outputRate"]
    assert state["playedFrames"] >= state["nonSilentFrames"]
    # the waterfall: every stage of a spoken turn, and the figure over it
    assert {
        "speech",
        "endpointing",
        "stt_final",
        "llm_first_token",
        "first_fragment",
        "tts_first_audio",
        "playback_start",
        "voice_to_voice",
    } <= set(state["shown"]["stages"])
    assert state["shown"]["v2v"].startswith(f"{math.floor(v2v + 0.5)} ms")  # JS Math.round (2398.5 -> 2399)
    assert (ARTEFACTS / "waterfall.png").stat().st_size > 1000


async def test_browser_barge_in_silences_the_reply_and_says_how_much_was_heard(assistant, tmp_path):
    """Speak over a long reply: playback stops at once, conversation.item.truncate carries the milliseconds
    actually played, and the page goes on to the next turn whatever the server answers to the truncate."""
    wav = utterance_wav(
        tmp_path / "barge-in.wav",
        [("Tell me a long story about a dragon and a knight.", 7.0), ("Stop. What is your name?", 2.0)],
    )
    # a reply long enough to be playing when "Stop" comes 7 s later, by construction: with the shipped prompt
    # ("one to three short sentences") SmolLM2 tells the story in one sentence, and a fast machine has played
    # it whole by then (the page then sees no barge-in). The fixture is shared: its prompt is restored below.
    shipped = assistant.config.dialog.system_prompt
    assistant.config.dialog.system_prompt = "You are a storyteller. Answer with a long story of many sentences."
    config = make_config(assistant.config, token=TOKEN)
    config.llm.max_new_tokens = 128  # the page's responses (about 40 s of speech); the session keeps the rest

    def talk() -> dict[str, Any]:
        with chromium(wav, tmp_path / "profile") as driver:
            open_page(driver, config.server.port)
            state = wait_for(
                driver,
                "a truncate, then a second reply",
                lambda s: s["truncates"] and len(s["replies"]) >= 2 and s["status"] == "listening",
                timeout=200,
            )
            state["notes"] = texts(driver, ".turn.assistant .note")
            state["console"] = severe_console(driver)
            return state

    try:
        async with serving(config, assistant):
            state = await asyncio.to_thread(talk)
    finally:
        assistant.config.dialog.system_prompt = shipped
    truncate = state["truncates"][0]
    print(f"\nbarge-in: {truncate}; notes {state['notes']}; errors {state['errors']}")
    assert truncate["content_index"] == 0 and truncate["item_id"].startswith("item_")
    assert 0 < truncate["audio_end_ms"] < 60_000
    assert any(note.startswith("interrupted") for note in state["notes"]), state["notes"]
    # "Stop." then a pause: the turn may end there and the rest hand it over (one answer to both words, the page
    # showing the cut turn's transcript too)
    assert len(state["transcripts"]) in (2, 3) and wer("Stop. What is your name?", state["transcripts"][-1]) <= 0.5
    assert state["console"] == []
    assert state["errors"] == []  # the server honours conversation.item.truncate


# ---- Firefox, over WebDriver BiDi --------------------------------------------------------------------------------


class Bidi:
    """Just enough WebDriver BiDi to drive one page: commands, and the console log kept as it arrives."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws, self.console, self._ids, self._waiting = ws, [], iter(range(1, 1 << 30)), {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.ws:
            message = json.loads(raw)
            if message.get("id") in self._waiting:
                self._waiting.pop(message["id"]).set_result(message)
            elif message.get("method") == "log.entryAdded":
                self.console.append(f"{message['params'].get('level')}: {message['params'].get('text')}")

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self._ids)
        self._waiting[number] = asyncio.get_running_loop().create_future()
        await self.ws.send(json.dumps({"id": number, "method": method, "params": params}))
        answer = await asyncio.wait_for(self._waiting[number], 60)
        assert answer.get("type") != "error", answer
        return answer["result"]

    async def evaluate(self, context: str, expression: str) -> Any:
        result = await self.call(
            "script.evaluate", expression=expression, target={"context": context}, awaitPromise=True
        )
        assert result["type"] == "success", result
        return result["result"].get("value")


@contextlib.asynccontextmanager
async def firefox(tmp_path: Path):
    """Headless Firefox with a fake microphone and a private PulseAudio null sink (with no audio output at all
    Firefox never starts an AudioContext)."""
    need(FIREFOX, "firefox-esr")
    need("pulseaudio", "pulseaudio")
    profile, run = tmp_path / "firefox", tmp_path / "pulse"
    profile.mkdir()
    run.mkdir()
    prefs = {
        "media.navigator.streams.fake": True,
        "media.navigator.permission.disabled": True,
        "media.autoplay.default": 0,
        "media.autoplay.block-webaudio": False,
        "app.update.enabled": False,
        "datareporting.policy.dataSubmissionEnabled": False,
        "browser.shell.checkDefaultBrowser": False,
    }
    (profile / "user.js").write_text("".join(f'user_pref("{k}", {json.dumps(v)});\n' for k, v in prefs.items()))
    env = {
        **os.environ,
        "PULSE_RUNTIME_PATH": str(run),
        "PULSE_STATE_PATH": str(run),
        "PULSE_SERVER": f"unix:{run / 'native'}",
    }
    pulse = subprocess.Popen(
        [
            "pulseaudio",
            "-n",
            "--daemonize=no",
            "--exit-idle-time=-1",
            "--load=module-null-sink sink_name=spk",
            "--load=module-always-sink",
            f"--load=module-native-protocol-unix socket={run / 'native'}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    port = free_port()
    browser = subprocess.Popen(
        [
            FIREFOX,
            "--headless",
            "--no-remote",
            "--profile",
            str(profile),
            f"--remote-debugging-port={port}",
            "about:blank",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ws = None
    try:
        for _ in range(120):
            try:
                ws = await connect(f"ws://127.0.0.1:{port}/session", max_size=1 << 26)
                break
            except OSError:
                await asyncio.sleep(0.25)
        assert ws is not None, "Firefox did not open its WebDriver BiDi port in 30 s"
        bidi = Bidi(ws)
        await bidi.call("session.new", capabilities={})
        await bidi.call("session.subscribe", events=["log.entryAdded"])
        yield bidi
    finally:
        if ws is not None:
            await ws.close()
        for process in (browser, pulse):
            process.terminate()
            await asyncio.to_thread(process.wait, 15)


async def test_firefox_streams_the_microphone_and_plays_a_typed_turn(assistant, tmp_path):
    config = make_config(assistant.config, token=TOKEN)
    async with serving(config, assistant), firefox(tmp_path) as bidi:
        context = (await bidi.call("browsingContext.getTree"))["contexts"][0]["context"]
        await bidi.call(
            "browsingContext.navigate",
            context=context,
            wait="complete",
            url=f"http://127.0.0.1:{config.server.port}/#token={TOKEN}",
        )

        async def state() -> dict[str, Any]:
            return json.loads(await bidi.evaluate(context, "JSON.stringify(window.specvoice)"))

        await bidi.evaluate(context, "document.getElementById('start').click()")
        deadline = time.monotonic() + 60
        while (s := await state())["micSamplesSent"] < WIRE_RATE and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        assert s["connected"] and s["micSamplesSent"] >= WIRE_RATE, s  # the worklet resamples Firefox's mic
        await bidi.evaluate(
            context,
            "document.getElementById('typed').value = 'Say hello to Bob.';"
            "document.getElementById('type-form').requestSubmit()",
        )
        deadline = time.monotonic() + 150
        while (
            not (
                (s := await state())["trace"] and s["replies"] and s["playedFrames"] > 0 and s["status"] == "listening"
            )
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.25)
        rows = json.loads(
            await bidi.evaluate(
                context,
                "JSON.stringify([...document.querySelectorAll('#waterfall-svg g.row')].map(g => g.dataset.stage))",
            )
        )
        shot = await bidi.call("browsingContext.captureScreenshot", context=context)
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    (ARTEFACTS / "firefox.png").write_bytes(base64.b64decode(shot["data"]))
    print(
        f"\nFirefox: reply {s['reply']!r}; text-to-voice {s['trace']['stages_ms'].get('text_to_voice')} ms; "
        f"{s['nonSilentFrames']} non-silent of {s['playedFrames']} samples played at {s['outputRate']} Hz"
    )
    assert s["errors"] == [] and s["reply"].strip(), s
    assert s["nonSilentFrames"] >= 0.3 * s["outputRate"]
    assert "text_to_voice" in rows and "llm_first_token" in rows
    assert not [line for line in bidi.console if line.startswith("error")], bidi.console
