"""Conversation behaviour on a real model (SmolLM2-135M, float32, greedy): a cancel before the first token
commits nothing, a prefill runs in chunks a cancel can land between, history trimming in blocks keeps the
prompt cache (and the output is still the target alone's), and n-gram self-drafting across turns and after a
trim is exact."""

from __future__ import annotations

import asyncio
import copy

import pytest

from llm.engine import DecodeSettings

from conftest_llm import smollm_engine

SYSTEM = "You are a helpful assistant. Answer briefly."
NGRAM = DecodeSettings(mode="ngram", draft_length=3, max_new_tokens=24, prefill_chunk=16)
TARGET = DecodeSettings(mode="target", max_new_tokens=24, prefill_chunk=0)


@pytest.fixture(scope="module")
def engine():
    return smollm_engine(NGRAM, context_limit=1024)


async def texts(conv, text, settings=NGRAM):
    return "".join([e.text async for e in conv.reply(text, settings)])


def target_alone(engine, messages, settings=TARGET):
    """The target alone's reply to exactly these messages, on fresh caches."""
    conv = engine.conversation(SYSTEM)
    conv.messages = copy.deepcopy(messages)
    return engine.decode(conv.prompt_ids(), settings)[0]


async def test_cancel_during_the_prefill_commits_nothing_and_lands_within_a_chunk(engine):
    conv = engine.conversation(SYSTEM)
    await texts(conv, "Hello!")
    before = copy.deepcopy(conv.messages)
    long_turn = "Please listen carefully. " * 40 + "Now tell me about the sea."
    steps = []
    real_step = None

    async def consume():
        async for _ in conv.reply(long_turn, NGRAM):
            pass

    original = engine.run

    async def counting_run(fn, *args):
        nonlocal real_step
        if getattr(fn, "__name__", "") == "step":
            steps.append(len(conv._target.ids))
            if len(steps) == 2:  # the second prefill chunk is about to run: cancel now
                task.cancel()
        return await original(fn, *args)

    engine.run = counting_run
    try:
        task = asyncio.create_task(consume())
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        engine.run = original
    assert conv.messages == before  # no user message, no empty assistant message: nothing happened
    held = conv.cached_tokens[0]
    prompt = conv.prompt_ids(conv.messages + [{"role": "user", "content": long_turn}])
    assert held < len(prompt) - NGRAM.prefill_chunk  # it stopped within the prompt, a chunk or two in
    with pytest.raises(ValueError, match="no reply to forget"):
        conv.forget_last_turn()  # the cancelled turn left nothing to forget
    # the conversation goes on, and its next reply is the target alone's for the same history
    got = await texts(conv, "What is two plus two?")
    assert got == engine.tokenizer.decode(target_alone(engine, conv.messages[:-1]), skip_special_tokens=True)


async def test_cancel_right_after_the_request_commits_nothing(engine):
    conv = engine.conversation(SYSTEM)
    before = copy.deepcopy(conv.messages)
    task = asyncio.create_task(texts(conv, "Tell me a long story about a dragon."))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert conv.messages == before


def test_chunked_prefill_gives_the_same_tokens_and_steps_commit_nothing_until_the_first_token(engine):
    conv = engine.conversation(SYSTEM)
    prompt = conv.prompt_ids(conv.messages + [{"role": "user", "content": "Name three rivers in Europe. " * 6}])
    reference, _ = engine.decode(prompt, TARGET)
    target, _ = engine.new_caches()
    gen = engine.generation(prompt, TARGET.but(prefill_chunk=10), target, None)
    empty = 0
    while not gen.new_tokens:
        empty += gen.step() == []
    assert empty == (len(prompt) - 2) // 10  # one step per chunk, the last chunk gives the first token
    while not gen.done:
        gen.step()
    assert gen.new_tokens == reference


async def test_block_trimming_keeps_the_prompt_cache_and_the_output_exact(engine):
    conv = engine.conversation(SYSTEM, history_tokens=200)
    prompts = [
        "Name a fruit.",
        "Name a city.",
        "Name an animal.",
        "Name a colour.",
        "Name a tree.",
        "Name a river.",
        "Name a planet.",
        "Name a flower.",
        "Name a sport.",
        "Name a tool.",
    ]
    prefill, trimmed_turns = [], []
    for text in prompts:
        trims = conv.trims
        messages_before = copy.deepcopy(conv.messages)
        got = await texts(conv, text, TARGET.but(max_new_tokens=16))
        prefill.append(conv.last_stats.prefill_tokens)
        trimmed_turns.append(conv.trims > trims)
        if conv.trims > trims:
            # a trim drops a block: down to trim_to of the budget, so the next turns append to a stable prefix
            assert len(conv.prompt_ids(conv.messages[:-1])) <= 100
            assert len(conv.messages) < len(messages_before)
        # whatever was trimmed, the reply is the target alone's on exactly the kept history
        assert got == engine.tokenizer.decode(
            target_alone(engine, conv.messages[:-1], TARGET.but(max_new_tokens=16)), skip_special_tokens=True
        )
    assert 1 <= sum(trimmed_turns) <= 4
    pairs = zip(prefill[1:], trimmed_turns[1:], trimmed_turns, strict=False)
    after_trim = [p for p, t, prev in pairs if not t and not prev]
    assert after_trim and max(after_trim) < 40  # untrimmed turns prefill only their new words: the cache survived


async def test_warm_trims_ahead_so_the_next_turn_reuses_the_cache(engine):
    conv = engine.conversation(SYSTEM, history_tokens=200)
    for text in ["Name a fruit.", "Name a city.", "Name an animal.", "Name a colour.", "Name a tree.", "Name a river."]:
        await texts(conv, text, TARGET.but(max_new_tokens=16))
        cached = await conv.warm()
        assert cached == conv.cached_tokens[0]
        trims = conv.trims
        await texts(conv, "And another one?", TARGET.but(max_new_tokens=16))
        assert conv.trims == trims  # warm already made room: the turn itself did not trim
        assert conv.last_stats.prefill_tokens < 20  # only the user's words were prefilled
    assert conv.trims >= 1


async def test_warm_between_a_reply_and_its_commit_trims_the_history_before_it(engine):
    """A voice turn commits its reply only once the audio has played; warm() in between (the session calls it at
    the reply's last token) trims ahead and prefills the history before that exchange, so neither the commit nor
    the next turn trims, the next turn prefills only its new words, and its reply is still the target's."""
    conv = engine.conversation(SYSTEM, history_tokens=200)
    settings = TARGET.but(max_new_tokens=16)
    pending_trims = 0
    for text in ["Name a fruit.", "Name a city.", "Name an animal.", "Name a colour.", "Name a tree.", "Name a river."]:
        history, before = len(conv.messages), conv.trims
        reply = "".join([e.text async for e in conv.reply(text, settings, commit=False)])
        assert conv.trims == before  # replies never trim: the warm-ups made room while nobody waited
        await conv.warm()
        trimmed = conv.trims > before
        pending_trims += trimmed
        assert conv.uncommitted  # warm never commits
        conv.commit(reply)
        assert conv.messages[-2:] == [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        assert (len(conv.messages) < history + 2) == trimmed  # the commit keeps what warm trimmed
        trims = conv.trims
        got = await texts(conv, "And another one?", settings)
        assert conv.trims == trims  # the room was made while nobody waited
        assert conv.last_stats.prefill_tokens < 60  # the committed exchange and the new words: the cache survived
        assert got == engine.tokenizer.decode(
            target_alone(engine, conv.messages[:-1], settings), skip_special_tokens=True
        )
    assert pending_trims >= 1


async def test_a_trim_is_prepared_over_earlier_warm_ups_and_stays_exact(engine):
    """Near the budget the next trim's cut is planned and its kept history prefilled into shadow caches by the
    warm-ups before it; the warm-up that trims then feeds only the exchanges since the plan, not all it keeps,
    and every reply is still the target alone's on exactly the kept history."""
    conv = engine.conversation(SYSTEM, history_tokens=600)
    settings = TARGET.but(max_new_tokens=8)
    trim_feeds = []
    for i in range(40):
        fed, trims = conv.warm_tokens, conv.trims
        cached = await conv.warm()
        if conv.trims > trims:
            trim_feeds.append((conv.warm_tokens - fed, cached))
        trims = conv.trims
        got = await texts(conv, f"Name a city, number {i + 1}.", settings)
        assert conv.trims == trims  # the warm-ups made room: no reply trims
        if i % 8 == 7:
            assert got == engine.tokenizer.decode(
                target_alone(engine, conv.messages[:-1], settings), skip_special_tokens=True
            )
    assert trim_feeds, "the conversation never reached its budget"
    for fed, cached in trim_feeds:
        assert fed < cached / 2, trim_feeds  # most of what a trim keeps was prefilled by earlier warm-ups


async def test_ngram_drafting_across_turns_and_after_a_trim_is_exact(engine):
    conv = engine.conversation(SYSTEM, history_tokens=160)
    name = "Zorblax Quintavious the Third"
    await texts(conv, f"My name is {name}. Please remember it.", TARGET)
    reply = await texts(conv, "What is my name? Say it in full.", NGRAM)
    assert reply == engine.tokenizer.decode(target_alone(engine, conv.messages[:-1]), skip_special_tokens=True)
    assert conv.last_stats.accepted > 0  # drafts came from the earlier turn and were accepted
    while conv.trims == 0:
        await texts(conv, f"Repeat after me: {name} likes tea.", NGRAM)
    trimmed = await texts(conv, f"Repeat after me once more: {name} likes tea.", NGRAM)
    assert trimmed == engine.tokenizer.decode(target_alone(engine, conv.messages[:-1]), skip_special_tokens=True)
    assert conv.last_stats.accepted > 0
