"""The llama.cpp engine on the real embedded GGUF pair (Qwen2.5-Coder 1.5B Q4_K_M target, 0.5B draft), through
llama-cpp-python: our loop gives exactly llama.cpp's own greedy output; speculation (draft model, n-gram) is
exact against the same engine's target alone (or, where a batched pass rounds differently, diverges only at a
near-tie, which is measured); cancels land within a prefill chunk; a barge-in trim and the next turn reuse the
cache; the engine falls back to k = 0 when drafting cannot pay; bad models and settings get one clear line."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import sys
import time

import pytest

from llm.engine import DecodeSettings, Engine
from llm.llamacpp import LlamaCppError, LlamaCppLM, check_threads
from llm.llamacpp_engine import LlamaCppEngine
from llm.models import IncompatibleDraftError
from llm.policy import DraftLengthPolicy
from llm.prompts import SYSTEM
from llm.vocab import chat_prompt
from voice.models import resolve

pytestmark = pytest.mark.big

QUESTIONS = ("How do I boil an egg?", "Why do cats like boxes?", "Tell me a fun fact about octopuses.")
N = 24
TARGET = DecodeSettings(mode="target", max_new_tokens=N)
# llama.cpp computes a pass over several tokens with other kernels than a single-token pass (repacked 4-bit
# matrix-matrix products): the same position's logits then differ by up to ~0.6 (measured on 4 prompts, any m
# from 2 to 9), so where the target's top two logits are closer than that, greedy speculation may pick the other
# one. A bug (a wrong position, a stale cache) shows as logits off by several units and divergence at wide gaps.
ROUNDING = 1.0


def gguf(name: str) -> str:
    return str(resolve(name, "llm", engine="llama.cpp").path)


@pytest.fixture(scope="module")
def engine() -> LlamaCppEngine:
    """The pair with the draft model kept (the fixed-k methods run it), calibrated on this machine."""
    target, draft = gguf("qwen2.5-coder-1.5b-instruct"), gguf("qwen2.5-coder-0.5b-instruct")
    return LlamaCppEngine.load_gguf(
        target,
        draft,
        mode="draft",
        context_limit=1024,
        settings=DecodeSettings(mode="draft", prefill_chunk=16),
        keep_draft=True,
    )


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def top2_gap(engine: Engine, prefix: list[int]) -> float:
    lm, _ = engine.new_caches()
    top = lm.logits(prefix)[-1].topk(2).values
    return float(top[0] - top[1])


def test_our_target_alone_is_llama_cpps_own_greedy_loop(engine):
    """llama-cpp-python's high-level generation loop, as a user runs it, gives the same tokens as our loop."""
    from llama_cpp import Llama

    reference = Llama(
        model_path=engine.info["target"], n_ctx=1024, n_threads=engine.target_model.threads, verbose=False
    )
    for text in QUESTIONS:
        prompt = chat_prompt(engine.tokenizer, text, SYSTEM)
        ours, _ = engine.decode(prompt, TARGET)
        reference.reset()
        theirs = []
        for token in reference.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            theirs.append(int(token))
            if token in engine.stop_ids or len(theirs) == N:
                break
        assert ours == theirs, text


@pytest.mark.parametrize(
    "settings",
    [
        DecodeSettings(mode="draft", draft_length=2, max_new_tokens=N),
        DecodeSettings(mode="draft", draft_length=4, max_new_tokens=N),
        DecodeSettings(mode="ngram", draft_length=3, max_new_tokens=N),
    ],
    ids=["draft k=2", "draft k=4", "ngram k=3"],
)
def test_speculation_is_the_target_alone_up_to_batched_rounding(engine, settings):
    """Greedy speculative output equals the same engine's target alone; where a multi-token pass rounds
    differently from a single-token one, the two differ only at a near-tie of the target's top two logits."""
    for text in QUESTIONS:
        prompt = chat_prompt(engine.tokenizer, text, SYSTEM)
        reference, _ = engine.decode(prompt, TARGET)
        tokens, stats = engine.decode(prompt, settings)
        at = first_divergence(tokens, reference)
        if at is None:
            assert tokens == reference
        else:
            gap = top2_gap(engine, prompt + reference[:at])
            assert gap < ROUNDING, f"{text!r} diverged at token {at} where the target's top-2 gap is {gap:.3f}"
        if settings.mode == "draft":
            assert stats.accepted > 0 and stats.target_calls < len(tokens)  # the draft really ran and saved passes


def test_verify_pass_gives_each_drafted_positions_logits(engine):
    """One pass over k drafted tokens gives the logits a token-by-token run gives at each position (to
    rounding), and asks llama.cpp for no other rows."""
    prompt = chat_prompt(engine.tokenizer, QUESTIONS[0], SYSTEM)
    reference, _ = engine.decode(prompt, TARGET.but(max_new_tokens=5))
    batched, _ = engine.new_caches()
    rows = batched.logits(prompt, reference[:4])
    assert rows.shape == (5, engine.vocab_size)
    stepwise, _ = engine.new_caches()
    real = len(engine.tokenizer)
    for i in range(5):
        row = stepwise.logits(prompt + reference[:i])[-1]
        assert int(row.argmax()) == reference[i] == int(rows[i].argmax())
        assert (row[:real] - rows[i][:real]).abs().max() < ROUNDING  # other kernels, the same numbers to rounding
    assert batched.greedy(prompt, reference[:4]) == reference[:5]


async def test_cancel_during_the_prefill_lands_within_a_chunk_and_the_next_turn_is_exact(engine):
    settings = DecodeSettings(mode="ngram", draft_length="adaptive", max_new_tokens=12, prefill_chunk=16)
    conv = engine.conversation(SYSTEM)
    long_turn = "Please listen carefully. " * 20 + "Now tell me about the sea."
    steps = []
    original = engine.run

    async def counting_run(fn, *args):
        if getattr(fn, "__name__", "") == "step":
            steps.append(len(conv._target.ids))
            if len(steps) == 3:  # two prefill chunks are in: cancel before the third
                task.cancel()
        return await original(fn, *args)

    async def consume():
        async for _ in conv.reply(long_turn, settings):
            pass

    engine.run = counting_run
    try:
        task = asyncio.create_task(consume())
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        engine.run = original
    assert conv.messages == [{"role": "system", "content": SYSTEM}]  # nothing was committed
    prompt = conv.prompt_ids(conv.messages + [{"role": "user", "content": long_turn}])
    held = conv.cached_tokens[0]
    assert 16 <= held <= 3 * 16 < len(prompt)  # it stopped a chunk or so in, not at the end of the prefill
    reply = "".join([e.text async for e in conv.reply("What is two plus two?", settings)])
    fresh, _ = engine.decode(conv.prompt_ids(conv.messages[:-1]), TARGET.but(max_new_tokens=12))
    assert reply == engine.tokenizer.decode(fresh, skip_special_tokens=True)


async def reply_tokens(conv, text: str, settings: DecodeSettings) -> list[int]:
    return [t for e in [e async for e in conv.reply(text, settings)] for t in e.token_ids]


def assert_target_alone(engine: Engine, prompt: list[int], tokens: list[int]) -> None:
    """tokens are the target alone's greedy reply to prompt, or differ from it first at a near-tie."""
    reference = [t for t in engine.decode(prompt, TARGET)[0] if t not in engine.stop_ids]
    at = first_divergence(tokens, reference)
    if at is None:
        assert tokens == reference[: len(tokens)] and len(tokens) == len(reference)
    else:
        assert top2_gap(engine, prompt + reference[:at]) < ROUNDING


async def test_trim_to_heard_and_the_next_turn_reuse_the_cache_exactly(engine):
    settings = DecodeSettings(mode="draft", draft_length=3, max_new_tokens=N, prefill_chunk=64)
    conv = engine.conversation(SYSTEM)
    first = engine.tokenizer.decode(await reply_tokens(conv, QUESTIONS[0], settings))
    heard = " ".join(first.split()[:3])
    conv.trim_last_reply(heard)  # a barge-in after three words
    assert conv.messages[-1] == {"role": "assistant", "content": heard}
    kept = conv.cached_tokens[0]
    assert conv._target.ids == conv.prompt_ids()[:kept] and kept > len(conv.prompt_ids()) // 2
    second = await reply_tokens(conv, QUESTIONS[1], settings)
    stats = conv.last_stats
    assert stats is not None and stats.prefill_tokens < stats.prompt_tokens / 2  # the history came from the cache
    assert_target_alone(engine, conv.prompt_ids(conv.messages[:-1]), second)


def test_k0_is_chosen_when_the_draft_is_made_expensive(monkeypatch):
    """A draft step that costs a full verify pass cannot pay: calibration drops the draft model and a
    "draft" request drafts from the conversation, whose adaptive length goes to 0 where that does not pay."""
    target, draft = gguf("qwen2.5-coder-1.5b-instruct"), gguf("qwen2.5-coder-0.5b-instruct")
    settings = DecodeSettings(mode="draft", draft_length="adaptive", max_new_tokens=N)
    engine = LlamaCppEngine.load_gguf(target, draft, mode="draft", settings=settings, calibrate=False)
    fast = LlamaCppLM._decode

    def expensive(self, feed, n_out):
        if self.gguf is engine.draft_model:
            time.sleep(0.1)  # a draft step slower than two target passes
        return fast(self, feed, n_out)

    monkeypatch.setattr(LlamaCppLM, "_decode", expensive)
    costs = engine.calibrate()
    monkeypatch.setattr(LlamaCppLM, "_decode", fast)
    assert costs["drafter"] == "ngram" and engine.drafter == "ngram"
    assert engine.draft_model is None  # unloaded: nothing will run it
    assert max(costs["draft_expected_speedup"].values()) == 1.0 == costs["draft_expected_speedup"][0]
    prompt = chat_prompt(engine.tokenizer, QUESTIONS[2], SYSTEM)
    tokens, stats = engine.decode(prompt, settings)
    assert_target_alone(engine, prompt, [t for t in tokens if t not in engine.stop_ids])
    assert stats.draft_lengths.count(0) >= len(stats.draft_lengths) * 3 // 4  # mostly the target alone


def test_the_policy_picks_k0_from_measured_costs():
    """On a compute-bound device (a verify pass over m tokens costs m single passes) nothing with alpha < 1
    pays; on a memory-bound one (flat verify cost) the same alpha drafts."""
    policy = DraftLengthPolicy(max_k=6)
    policy.verify_s = {1: 0.030, 2: 0.060, 3: 0.085, 4: 0.110}
    policy.draft_s = 0.0
    assert policy.choose(50) == 0
    policy.verify_s = {1: 0.030, 2: 0.031, 3: 0.032, 4: 0.033}
    assert policy.choose(50) >= 2


def test_a_missing_or_damaged_gguf_is_one_clear_line(tmp_path):
    with pytest.raises(LlamaCppError, match="does not exist; fix"):
        LlamaCppEngine.load_gguf(str(tmp_path / "nothing.gguf"), None, mode="target")
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(LlamaCppError, match="not a GGUF file.*fix"):
        LlamaCppEngine.load_gguf(str(not_gguf), None, mode="target")
    # a truncated copy: the header is right, the tensors are not all there
    source = resolve("smollm2-135m-instruct", "llm", engine="llama.cpp").path
    damaged = tmp_path / "damaged"
    shutil.copytree(source, damaged)
    with open(damaged / "model.gguf", "r+b") as fh:
        fh.truncate(4 << 20)
    with pytest.raises(LlamaCppError, match="could not load .*fix: `specvoice models verify --repair`"):
        LlamaCppEngine.load_gguf(str(damaged), None, mode="target")


def test_a_pair_whose_vocabularies_differ_is_refused_before_loading():
    with pytest.raises(IncompatibleDraftError, match="fix: use a draft from the target's model family"):
        LlamaCppEngine.load_gguf(
            gguf("smollm2-135m-instruct"), gguf("qwen2.5-coder-0.5b-instruct"), mode="draft", calibrate=False
        )


def test_a_thread_count_out_of_range_names_the_key_and_the_fix():
    with pytest.raises(ValueError, match=r"llm.threads = 999.*fix: set llm.threads between 1 and"):
        check_threads(999)
    with pytest.raises(ValueError, match="llm.threads"):
        LlamaCppEngine.load_gguf(gguf("smollm2-135m-instruct"), None, mode="target", threads=999)


def test_llama_cpp_python_missing_is_one_line_with_the_fix(monkeypatch):
    import llm.llamacpp as backend

    monkeypatch.setattr(backend, "_lib", None)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # what an install whose build failed looks like
    with pytest.raises(LlamaCppError, match="needs llama-cpp-python.*fix: `make install`.*llm.engine = 'torch'"):
        backend.GgufModel.load(gguf("smollm2-135m-instruct"), threads=1, context_limit=256, batch=32)


async def test_one_conversation_failing_leaves_the_others_serving(engine):
    """A pass that overflows one conversation's context fails that reply only."""
    ok = engine.conversation(SYSTEM)
    broken = engine.conversation(SYSTEM)
    broken._target.gguf = dataclasses.replace(engine.target_model, context_limit=8, spare=[])
    with pytest.raises(LlamaCppError, match="do not fit the context"):
        async for _ in broken.reply(QUESTIONS[0], TARGET):
            pass
    assert broken.messages == [{"role": "system", "content": SYSTEM}]
    assert_target_alone(
        engine,
        ok.prompt_ids(ok.messages + [{"role": "user", "content": QUESTIONS[0]}]),
        await reply_tokens(ok, QUESTIONS[0], TARGET),
    )


def test_token_trees_on_llama_cpp_are_refused_with_the_fix():
    """Trees are a torch-engine option: asking llama.cpp for them is one clear line, not a wrong answer."""
    with pytest.raises(ValueError, match=r"token trees run on the torch engine only; fix: set llm.tree = false"):
        LlamaCppEngine.load_gguf(
            gguf("smollm2-135m-instruct"),
            None,
            mode="ngram",
            settings=DecodeSettings(mode="ngram", tree=True),
            calibrate=False,
        )
