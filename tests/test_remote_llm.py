"""The remote LLM backend (llm.backend = "openai") against a real OpenAI-compatible server the test starts
(``transformers serve`` on SmolLM2 from the model cache, tests/openai_server.py), through the real voice loop
(Session, Turn, clause chunker, piper): streaming, a barge-in that closes the request on the server, the history
trimmed to what was heard across turns, a server that is down, killed mid-stream or slow to its first token, and
a 429; and over the websocket (the openai SDK's realtime client), text asks answered aloud after cancels. Whisper
and piper run here; the LLM runs only in the server process."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import numpy as np
import pytest
from openai import AsyncOpenAI
from prometheus_client import CollectorRegistry, Counter, generate_latest

from audio.frames import SPEECH_RATE
from audio.resample import resample
from audio.sinks import WavSink
from llm.models import load_tokenizer
from llm.remote import RemoteEngine, RemoteSettings
from llm.remote_metrics import parse_spec_counters
from voice.assistant import Assistant
from voice.config import ConfigError, load_config
from voice.events import ReplyAudio, ReplyTextDelta, SpeechStarted, State, TranscriptFinal, TurnDone, TurnError
from voice.models import resolve
from voice.speechset import piper_utterance

from broker import free_port
from openai_server import OpenAIServer
from realtime_client import make_config
from serving import sdk, serving
from test_pipeline import Mic, Recorder

STORY = "Tell me a long story about a brave little fox."


@pytest.fixture(scope="module")
def model_dir(small_config) -> str:
    return str(resolve(small_config.models.target, "llm", small_config.models.cache_dir).path)


@pytest.fixture(scope="module")
def server(model_dir):
    running = OpenAIServer(model_dir, free_port()).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def assistant(small_config, server, model_dir):
    """Whisper, piper and the VAD here; the LLM behind the server (its engine is swapped per test when needed)."""
    config = small_config.model_copy(deep=True)
    config.llm.base_url, config.llm.tokenizer = server.base_url, model_dir  # base_url first: it is validated
    config.llm.backend = "openai"
    config.llm.max_new_tokens = 40
    config.llm.first_token_timeout_s = 60.0  # a CPU server on a shared 2-core machine; the slow test sets its own
    return Assistant.load_sync(config)


def on_engine(assistant, base_url: str, tokenizer, **remote) -> Assistant:
    """The same speech models with an LLM at ``base_url``."""
    engine = RemoteEngine(RemoteSettings(base_url, **remote), tokenizer)
    return Assistant(assistant.config, engine, assistant.stt, assistant.tts, assistant.vad_path)


def spoken_words(assistant, events) -> str:
    """What the ReplyAudio events say, transcribed back by Whisper."""
    pcm = np.concatenate([e.samples for e in events if isinstance(e, ReplyAudio)])
    return " ".join(
        w.text
        for w in assistant.stt.decode(
            resample(pcm, assistant.tts_sample_rate, SPEECH_RATE).astype(np.float32) / 32768.0
        )
    ).lower()


class Timed(Recorder):
    """A Recorder (which notes when each event came, time.monotonic()) that lists the times of one kind."""

    def when(self, kind) -> list[float]:
        return [t for t, e in zip(self.times, self.events, strict=True) if isinstance(e, kind)]


async def test_remote_reply_streams_tokens_into_the_voice_loop(assistant, server):
    rec = Timed()
    session = assistant.session(rec)
    done = await session.ask("What is the capital of France?")
    stats = session.conversation.last_stats
    deltas = [e.text for e in rec.of(ReplyTextDelta) if e.text]
    assert len(deltas) >= 2 and "".join(deltas).strip() == done.reply
    # each token went on into the chunker as it arrived: the first words left before the last token came
    assert len(stats.token_times) == len(deltas) and stats.token_times == sorted(stats.token_times)
    assert rec.when(ReplyTextDelta)[0] < stats.token_times[-1]
    assert rec.of(ReplyAudio), "the reply was spoken"
    decoder = done.trace["decoder"]
    assert decoder["backend"] == "openai" and decoder["token_times"] == stats.token_times
    assert decoder["ttft_s"] > 0 and decoder["new_tokens"] >= len(deltas)
    assert "llm_first_token" in done.trace["marks_ms"] and "playback_start" in done.trace["marks_ms"]
    sent = server.requests()[-1]["messages"]
    assert sent == [
        {"role": "system", "content": assistant.config.dialog.system_prompt},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    assert session.history[1:] == [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": done.reply},
    ]
    # the server's counters are read after the last token, before the reply's stream ends
    assert stats.server_spec == {"reported": False, "note": "not reported by the server"}
    await session.close()


async def test_barge_in_closes_the_request_on_the_server(assistant, server):
    rec, sink = Timed(), WavSink(None, assistant.tts_sample_rate, realtime=True)
    session = assistant.session(rec, sink=sink)
    session.decode.max_new_tokens = 300
    cancels = len(server.cancels())
    asking = asyncio.create_task(session.ask(STORY))
    await rec.wait_for(lambda e: sink.played_samples > 1.5 * assistant.tts_sample_rate)  # some words heard
    mic = Mic(session)
    speaking = time.monotonic()
    await mic.play(piper_utterance("Stop, wait a moment please.", deterministic=True))
    done = await asking
    assert done.interrupted and rec.of(SpeechStarted)
    cancel = (await asyncio.to_thread(server.wait_for, "cancels", cancels + 1))[-1]
    assert cancel["tokens"] < 300, "the server stopped generating when the connection closed"
    assert cancel["t"] > speaking, "it was our barge-in that closed it"
    generated = "".join(e.text for e in rec.of(ReplyTextDelta))
    assert generated.split()[: len(done.reply.split())] == done.reply.split()
    # the interrupting words become the next turn, and the server gets only what was heard of the first reply
    requests = len(server.requests())
    await mic.silence(1.0)
    await rec.wait_for(lambda e: isinstance(e, TranscriptFinal))
    sent = (await asyncio.to_thread(server.wait_for, "requests", requests + 1))[-1]["messages"]
    assert done.reply and sent[1:3] == [
        {"role": "user", "content": STORY},
        {"role": "assistant", "content": done.reply},
    ]
    await session.close()
    sink.close()


async def until(conn, kind: str, timeout: float = 150.0) -> list[dict]:
    """Server events up to the first of ``kind``; an ``error``, or a ``response.done`` that comes first, fails
    the test at once with what the server said."""
    out: list[dict] = []
    async with asyncio.timeout(timeout):
        while True:
            event = json.loads(await conn.recv_bytes())
            out.append(event)
            if event["type"] == kind:
                return out
            assert event["type"] not in ("error", "response.done"), f"waiting for {kind}, got {event}"


async def test_websocket_text_asks_after_cancels_are_answered_aloud(assistant, server):
    """A websocket client's text turn (conversation.item.create, then response.create) asks for the reply to the
    history as it stands: the user's words are already there, no new text comes with the request. Three asks
    cancelled at their first audio (each cancel closes the request on the server), then a fourth is answered
    aloud, and the server gets one user message for the unanswered questions (its template refuses two in a
    row)."""
    config = make_config(assistant)
    async with serving(config, assistant):
        async with sdk(f"ws://127.0.0.1:{config.server.port}/v1").realtime.connect(model="smollm2") as conn:
            await until(conn, "session.created")
            for _ in range(3):
                cancels = len(server.cancels())
                await conn.conversation.item.create(
                    item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": STORY}]}
                )
                await conn.response.create(response={"max_output_tokens": 300})
                await until(conn, "response.output_audio.delta")
                await conn.response.cancel()
                assert (await until(conn, "response.done"))[-1]["response"]["status"] == "cancelled"
                closed = await asyncio.to_thread(server.wait_for, "cancels", cancels + 1)
                assert closed[-1]["tokens"] < 300, "the cancel closed the request on the server"
            question = "What is the capital of France?"
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}
            )
            await conn.response.create()
            events = await until(conn, "response.done")
    assert events[-1]["response"]["status"] == "completed"
    assert any(e["type"] == "response.output_audio.delta" for e in events), "the reply was spoken"
    sent = server.requests()[-1]["messages"]
    assert sent[-1]["role"] == "user" and sent[-1]["content"].endswith(question)
    roles = [m["role"] for m in sent]
    assert roles[0] == "system" and all(a != b for a, b in itertools.pairwise(roles[1:])), roles


async def test_trim_to_heard_across_turns(assistant, server):
    session = assistant.session(Recorder())
    await session.ask("Tell me about the moon in three sentences.")
    full = session.history[-1]["content"]
    kept = session.truncate(1500)  # the client says its listener heard only 1.5 s of the reply
    assert kept and full.startswith(kept) and len(kept) < len(full)
    assert session.history[-1] == {"role": "assistant", "content": kept}
    await session.ask("And the sun?")
    sent = server.requests()[-1]["messages"]
    assert sent[2] == {"role": "assistant", "content": kept}, "the server never sees the unheard words"
    assert sent[3] == {"role": "user", "content": "And the sun?"}
    await session.close()


async def test_server_down_speaks_an_apology_and_the_next_turn_retries(assistant, model_dir, tokenizer):
    port = free_port()  # nothing listens here yet
    rec = Recorder()
    session = on_engine(
        assistant, f"http://127.0.0.1:{port}/v1", tokenizer, retries=1, first_token_timeout_s=60.0
    ).session(rec)
    await session.ask("Hello, are you there?")
    error = rec.of(TurnError)[0]
    assert error.stage == "llm" and f"127.0.0.1:{port}" in error.message and "fix:" in error.message
    assert "sorry" in spoken_words(assistant, rec.events), "the apology was spoken"
    assert session.conversation.last_stats.attempts == 2
    assert session.history == [{"role": "system", "content": assistant.config.dialog.system_prompt}]
    assert session.state == State.IDLE
    late = await asyncio.to_thread(OpenAIServer(model_dir, port).start)  # it comes up: the next turn just works
    try:
        done = await session.ask("Hello, are you there?")
    finally:
        late.stop()
    assert done.reply and len(rec.of(TurnError)) == 1
    assert [m["role"] for m in session.history] == ["system", "user", "assistant"]
    await session.close()


async def test_server_killed_mid_stream(assistant, model_dir, tokenizer):
    doomed = await asyncio.to_thread(OpenAIServer(model_dir, free_port()).start)
    rec = Recorder()
    session = on_engine(assistant, doomed.base_url, tokenizer, first_token_timeout_s=60.0).session(rec)
    session.decode.max_new_tokens = 300
    asking = asyncio.create_task(session.ask(STORY))
    await rec.wait_for(lambda e: isinstance(e, ReplyTextDelta) and len(e.text.strip()) > 0)
    await asyncio.to_thread(doomed.kill)
    done = await asking
    error = rec.of(TurnError)[0]
    assert error.stage == "llm" and "broke off the reply" in error.message
    assert "sorry" in spoken_words(assistant, rec.events)
    generated = "".join(e.text for e in rec.of(ReplyTextDelta))
    assert session.history[-1]["role"] == "assistant" and generated.startswith(session.history[-1]["content"])
    assert done.reply == session.history[-1]["content"]
    await session.ask("Are you still there?")  # the server stays dead: a clear error again, the session goes on
    assert rec.of(TurnError)[1].stage == "llm" and "cannot reach" in rec.of(TurnError)[1].message
    assert session.state == State.IDLE
    await session.close()


async def test_slow_first_token_times_out_with_an_apology(assistant, server, tokenizer):
    # a busy server: another client's long generation holds transformers serve's one generation thread
    other = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    busy = await other.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Count to ten thousand."}],
        stream=True,
        extra_body={"generation_config": json.dumps({"max_new_tokens": 5000, "min_new_tokens": 5000})},
    )
    while not ((chunk := await anext(busy)).choices and chunk.choices[0].delta.content):
        pass  # until its generation runs
    cancels = len(server.cancels())
    rec = Recorder()
    session = on_engine(assistant, server.base_url, tokenizer, first_token_timeout_s=1.5).session(rec)
    try:
        await session.ask("Hello?")
    finally:
        await busy.close()
        await other.close()
    error = rec.of(TurnError)[0]
    assert error.stage == "llm" and "within 1.5 s" in error.message and "llm.first_token_timeout_s" in error.message
    assert "sorry" in spoken_words(assistant, rec.events)
    assert session.conversation.last_stats.attempts == 1, "a timeout is not retried: the budget is spent"
    closed = await asyncio.to_thread(server.wait_for, "cancels", cancels + 2)
    assert any(c["tokens"] == 0 for c in closed[cancels:]), "our request was closed before its first token"
    done = await session.ask("Hello?")  # the server is free again
    assert done.reply and len(rec.of(TurnError)) == 1
    await session.close()


class FakeBusyServer:
    """Stands in for a server at capacity: every HTTP request gets 429 with Retry-After: 0 (the server's rate
    limiting is not under test; our retries and the spoken answer are)."""

    def __init__(self) -> None:
        self.requests = 0
        self.port = 0

    async def __aenter__(self) -> FakeBusyServer:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
        length = next((int(line.split(":")[1]) for line in head.split("\r\n") if line.startswith("content-length:")), 0)
        await reader.readexactly(length)  # all of it: closing on unread bytes would reset the connection
        self.requests += 1
        body = b'{"error": {"message": "too many requests", "type": "rate_limit_exceeded"}}'
        writer.write(
            b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 0\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()


async def test_429_is_retried_before_the_first_token_then_spoken(assistant, tokenizer):
    async with FakeBusyServer() as busy:
        rec = Recorder()
        session = on_engine(
            assistant, f"http://127.0.0.1:{busy.port}/v1", tokenizer, model="smollm2", retries=2
        ).session(rec)
        await session.ask("Hello?")
    error = rec.of(TurnError)[0]
    assert busy.requests == 3 and error.stage == "llm" and "429" in error.message
    assert "busy" in spoken_words(assistant, rec.events)
    assert not rec.of(TurnDone)[0].reply
    await session.close()


def test_history_is_trimmed_to_history_tokens_with_and_without_a_tokenizer(tokenizer):
    for tok in (tokenizer, None):
        conversation = RemoteEngine(RemoteSettings("http://127.0.0.1:9/v1"), tok).conversation("Be brief.", 120)
        for i in range(8):
            conversation.messages += [
                {"role": "user", "content": f"Question number {i} about the weather?"},
                {"role": "assistant", "content": f"Answer number {i}: it will be sunny."},
            ]
        full = conversation.messages + [{"role": "user", "content": "And tomorrow?"}]
        kept = conversation._fit_history(full)
        assert kept[0]["role"] == "system" and kept[-1]["content"] == "And tomorrow?"
        first = len(full) - (len(kept) - 1)  # where the kept exchanges start in the full history
        assert conversation.count_tokens(kept) <= 120 < conversation.count_tokens(full[:1] + full[first - 2 :])
        assert "Question number 7" in kept[-3]["content"], "the newest exchanges stay"
    exact = RemoteEngine(RemoteSettings("http://127.0.0.1:9/v1"), tokenizer).conversation("Be brief.")
    assert exact.count_tokens(exact.messages) == len(exact.prompt_ids())


def test_vllm_spec_counters_are_read_and_others_are_not_reported():
    registry = CollectorRegistry()  # what vLLM's /metrics says (it exports with prometheus_client too)
    for name, value in (("drafts", 100), ("draft_tokens", 400), ("accepted_tokens", 300)):
        counter = Counter(f"vllm:spec_decode_num_{name}", "", ["model_name", "engine"], registry=registry)
        counter.labels("Qwen/Qwen2.5-7B-Instruct", "0").inc(value * 0.75)
        counter.labels("Qwen/Qwen2.5-7B-Instruct", "1").inc(value * 0.25)
    counters = parse_spec_counters(generate_latest(registry).decode())
    assert counters is not None
    assert (counters.drafts, counters.draft_tokens, counters.accepted_tokens) == (100, 400, 300)
    window = counters.window(None)
    assert window["window_acceptance"] == 0.75 and window["window_mean_accepted_length"] == 4.0
    assert parse_spec_counters("# HELP other_total x\n# TYPE other_total counter\nother_total 3.0\n") is None


def test_remote_config_names_what_is_missing():
    with pytest.raises(ConfigError, match="llm.base_url"):
        load_config("configs/small.toml", ["llm.backend=openai"], environ={})
    with pytest.raises(ConfigError, match=r"stt.uri = 'tcp://host:port'"):
        load_config("configs/small.toml", ["stt.backend=wyoming", "stt.uri=http://x:1"], environ={})
    config = load_config("configs/remote.toml", environ={})
    assert config.llm.backend == "openai" and config.llm.base_url
