"""The async Conversation API on a real model (SmolLM2-135M, float32, greedy): streaming, cross-turn cache reuse,
cancellation, barge-in trimming, several conversations on one engine, and bad input."""

from __future__ import annotations

import asyncio
import copy

import pytest

from llm.engine import ContextLimitError, DecodeSettings, Engine
from llm.models import IncompatibleDraftError, ModelLoadError, load_causal_lm
from voice.models import resolve

from conftest_llm import smollm_engine, smollm_fp32

SYSTEM = "You are a helpful assistant. Answer briefly."
SETTINGS = DecodeSettings(mode="ngram", draft_length=3, max_new_tokens=20)


@pytest.fixture(scope="module")
def engine():
    return smollm_engine(SETTINGS)


async def collect(conv, text, settings=SETTINGS):
    return [e async for e in conv.reply(text, settings)]


def fresh_like(engine, conv):
    """A new conversation with the same messages and empty caches: what a kept cache must reproduce."""
    other = engine.conversation(SYSTEM)
    other.messages = copy.deepcopy(conv.messages)
    return other


async def test_reply_streams_verified_text_with_timestamps(engine):
    conv = engine.conversation(SYSTEM)
    prompt = conv.prompt_ids(conv.messages + [{"role": "user", "content": "What is the capital of France?"}])
    reference, _ = engine.decode(prompt, DecodeSettings(mode="target", max_new_tokens=20))
    loop = asyncio.get_running_loop()
    start = loop.time()
    out = await collect(conv, "What is the capital of France?")
    tokens = [t for e in out for t in e.token_ids]
    assert tokens == [t for t in reference if t not in engine.stop_ids]
    text = "".join(e.text for e in out)
    assert text == engine.tokenizer.decode(tokens, skip_special_tokens=True)
    times = [e.t for e in out]
    assert times == sorted(times) and times[0] >= start
    assert conv.messages[-1] == {"role": "assistant", "content": text}
    stats = conv.last_stats
    assert stats.new_tokens == len(reference) and stats.target_calls >= 2
    assert len(stats.token_times) == stats.new_tokens
    assert stats.mean_accepted_length >= 1.0 and "tok/s" in stats.log_line()
    assert stats.to_dict()["prefill_tokens"] == stats.prompt_tokens == len(prompt)


async def test_second_turn_prefills_only_its_new_tokens_and_matches_a_fresh_cache(engine):
    conv = engine.conversation(SYSTEM)
    await collect(conv, "Name a fruit.")
    first = conv.last_stats
    fresh = fresh_like(engine, conv)
    second_text = "".join(e.text for e in await collect(conv, "And a vegetable?"))
    second = conv.last_stats
    assert second.prefill_tokens < second.prompt_tokens - first.prompt_tokens // 2  # most of it came from the cache
    assert second_text == "".join(e.text for e in await collect(fresh, "And a vegetable?"))
    assert fresh.last_stats.prefill_tokens == fresh.last_stats.prompt_tokens


async def test_warm_prefills_the_system_prompt_and_changes_nothing_else(engine):
    conv = engine.conversation(SYSTEM)
    cached = await conv.warm()
    assert cached > 5 and conv.cached_tokens[0] == cached
    fresh = engine.conversation(SYSTEM)
    warm_text = "".join(e.text for e in await collect(conv, "Name a colour."))
    assert conv.last_stats.prefill_tokens == conv.last_stats.prompt_tokens - cached
    assert warm_text == "".join(e.text for e in await collect(fresh, "Name a colour."))


async def test_forget_last_turn_undoes_a_reply_as_if_it_never_ran(engine):
    conv = engine.conversation(SYSTEM)
    with pytest.raises(ValueError, match="no reply to forget"):
        conv.forget_last_turn()
    await collect(conv, "Hello!")
    before = copy.deepcopy(conv.messages)
    stream = conv.reply("Name a fruit.", SETTINGS)
    await stream.__anext__()
    with pytest.raises(RuntimeError, match="still streaming"):
        conv.forget_last_turn()
    await stream.aclose()
    conv.forget_last_turn()
    assert conv.messages == before
    with pytest.raises(ValueError, match="no reply to forget"):
        conv.forget_last_turn()  # once only: the turn before is not undone by a second call
    # the forgotten reply's tokens are still in the caches; the next turn must not see them
    fresh = engine.conversation(SYSTEM)
    await collect(fresh, "Hello!")
    assert "".join(e.text for e in await collect(conv, "Name a colour.")) == "".join(
        e.text for e in await collect(fresh, "Name a colour.")
    )


async def test_event_loop_keeps_running_while_the_model_computes(engine):
    conv = engine.conversation(SYSTEM)
    ticks = 0
    stop = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    seen = []
    async for _ in conv.reply("Tell me about the sea."):
        seen.append(ticks)
    stop.set()
    await task
    steps = conv.last_stats.target_calls
    assert ticks >= steps  # the loop ran between and during model steps
    assert len(set(seen)) > 1


async def test_cancel_stops_within_one_step_and_leaves_consistent_caches(engine):
    conv = engine.conversation(SYSTEM)
    got = []
    first = asyncio.Event()

    async def consume():
        async for e in conv.reply("Describe a forest in detail.", DecodeSettings(mode="target", max_new_tokens=40)):
            got.append(e)
            first.set()

    task = asyncio.create_task(consume())
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 1 <= len(got) <= 2  # at most the step already in flight could still have emitted
    assert conv.messages[-1] == {"role": "assistant", "content": "".join(e.text for e in got)}
    # the next turn, on the kept caches (with a step that finished after the cancel), equals a fresh start
    fresh = fresh_like(engine, conv)
    a = [e.token_ids for e in await collect(conv, "Thanks. What colour are leaves?")]
    b = [e.token_ids for e in await collect(fresh, "Thanks. What colour are leaves?")]
    assert a == b


async def test_aclose_and_a_reused_stream(engine):
    conv = engine.conversation(SYSTEM)
    stream = conv.reply("Count to ten.")
    await anext(stream)
    with pytest.raises(RuntimeError, match="already streaming"):
        await anext(conv.reply("Another question"))
    await stream.aclose()
    with pytest.raises(StopAsyncIteration):  # a closed stream stays closed: a defined, empty result
        await anext(stream)
    assert conv.messages[-1]["role"] == "assistant"
    assert len(await collect(conv, "Now count to three.")) > 0  # the conversation itself works on


async def test_trim_last_reply_continues_from_what_was_heard(engine):
    conv = engine.conversation(SYSTEM)
    await collect(conv, "Tell me a short story about a cat.")
    reply = conv.messages[-1]["content"]
    words = reply.split()
    assert len(words) >= 4
    heard = " ".join(words[:3])  # as the speaker rebuilds it: words joined by single spaces
    before = conv.cached_tokens[0]
    conv.trim_last_reply(heard)
    assert reply.startswith(conv.messages[-1]["content"])
    assert conv.messages[-1]["content"].split() == words[:3]
    assert conv.cached_tokens[0] < before
    assert conv.cached_tokens[0] <= len(conv.prompt_ids())
    fresh = fresh_like(engine, conv)
    a = [e.token_ids for e in await collect(conv, "Go on.")]
    b = [e.token_ids for e in await collect(fresh, "Go on.")]
    assert a == b
    with pytest.raises(ValueError, match="not a prefix"):
        conv.trim_last_reply("something never said")
    conv.trim_last_reply("")
    assert conv.messages[-1] == {"role": "assistant", "content": ""}


async def test_conversations_share_one_engine_without_mixing_caches(engine):
    a, b = engine.conversation(SYSTEM), engine.conversation(SYSTEM)
    alone_a = fresh_like(engine, a)
    alone_b = fresh_like(engine, b)
    together = await asyncio.gather(collect(a, "What is two plus two?"), collect(b, "Name a colour."))
    assert [e.token_ids for e in together[0]] == [e.token_ids for e in await collect(alone_a, "What is two plus two?")]
    assert [e.token_ids for e in together[1]] == [e.token_ids for e in await collect(alone_b, "Name a colour.")]


async def test_history_drops_the_oldest_turns_beyond_its_budget(engine):
    conv = engine.conversation(SYSTEM, history_tokens=80)
    await collect(conv, "Name a fruit.")
    await collect(conv, "Name a city.")
    await collect(conv, "Name an animal.")
    assert conv.messages[0]["role"] == "system"
    assert conv.messages[-1]["role"] == "assistant" and conv.messages[-2]["content"] == "Name an animal."
    assert len(conv.prompt_ids(conv.messages[:-1])) <= 80 or len(conv.messages) == 3
    assert "Name a fruit." not in [m["content"] for m in conv.messages]


async def test_bad_input_gives_clear_errors_and_leaves_the_conversation_intact(engine):
    conv = engine.conversation(SYSTEM, history_tokens=64)  # small: the refused turn would also drop old turns
    await collect(conv, "Hello!")
    messages, cached = copy.deepcopy(conv.messages), conv.cached_tokens
    with pytest.raises(ValueError, match="empty user text"):
        await collect(conv, "   ")
    with pytest.raises(ContextLimitError, match="context_limit"):
        await collect(conv, "word " * 600)
    assert await collect(conv, "Hi again", DecodeSettings(mode="target", max_new_tokens=0)) == []
    assert conv.messages == messages and conv.cached_tokens == cached
    with pytest.raises(ValueError, match="max_new_tokens"):
        DecodeSettings(max_new_tokens=-1)
    with pytest.raises(ValueError, match="needs a draft model"):
        await collect(conv, "Hi", DecodeSettings(mode="draft"))
    assert conv.messages == messages
    assert len(await collect(conv, "Are you still there?")) > 0  # and it still works


def test_incompatible_draft_is_refused_at_load():
    smollm = str(resolve("smollm2-135m-instruct", "llm").path)
    qwen = str(resolve("qwen2.5-coder-0.5b-instruct", "llm").path)
    with pytest.raises(IncompatibleDraftError, match="tokenizer has .* tokens"):
        Engine.load(smollm, qwen, dtype="float32", mode="draft")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_causal_lm("/nonexistent/model")
    with pytest.raises(ModelLoadError, match="offline"):
        load_causal_lm("hub:nobody/no-such-model")


async def test_first_token_comes_from_the_target_before_the_draft_runs():
    """First-token priority: when the first piece is emitted, the draft has not yet seen the new turn."""
    model, tok = smollm_fp32()
    engine = Engine(
        model, tok, model, mode="draft", settings=DecodeSettings(mode="draft", draft_length=2, max_new_tokens=12)
    )
    conv = engine.conversation(SYSTEM)
    await collect(conv, "Name a fruit.", engine.settings)
    draft_before = conv.cached_tokens[1]
    seen = []
    async for _ in conv.reply("Name a colour.", engine.settings):
        seen.append(conv.cached_tokens)
    assert seen[0][1] <= draft_before  # the draft's cache did not grow before the first emission
    assert seen[0][0] > draft_before  # while the target had already prefilled the new turn
    assert seen[-1][1] > draft_before  # later steps did draft
    assert conv.last_stats.drafted > 0


def test_settings_from_config_and_the_tree_flag():
    settings = DecodeSettings.from_config(
        {"mode": "ngram", "draft_length": 4, "max_new_tokens": 8, "device": "cpu", "tree": False}
    )
    assert (settings.mode, settings.draft_length, settings.max_new_tokens) == ("ngram", 4, 8)
    tree = DecodeSettings.from_config({"tree": True, "tree_width": 3})
    assert (tree.tree, tree.tree_width, tree.width) == (True, 3, 3)
    with pytest.raises(ValueError, match="tree_width"):
        DecodeSettings.from_config({"tree": True, "tree_width": 0})
