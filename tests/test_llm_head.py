"""The draft's output head: rows that differ from the target's (padding) are aligned or refused, and the
reduced head is chosen from token counts of real replies (llm/vocab.py)."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
import torch
from transformers import AutoTokenizer

from llm.engine import DecodeSettings, Engine
from llm.head_coverage import SHIPPED, TARGET, coverage_table, load_replies
from llm.models import IncompatibleDraftError
from llm.prompts import HEAD_HELD_OUT_SHARE, HELD_OUT, VOICE_PROMPTS, head_split
from llm.vocab import (
    HUMAN_MIN_COUNT,
    MANIFEST,
    PACKAGED,
    build_counts,
    corpus_counts,
    count_tokens,
    counted_prompts,
    coverage,
    generate_replies,
    head_ids,
    load_counts,
    packaged_counts,
    save_counts,
)
from voice.models import resolve

from conftest_llm import chat_ids, smollm_fp32


def with_head_rows(model, rows: int, pad_value: float = 0.0):
    """A copy of model whose output head has ``rows`` rows: real rows kept, extra padding rows filled with
    pad_value (a large value makes them win every argmax unless they are masked)."""
    out = copy.deepcopy(model)
    head = model.get_output_embeddings().weight.data
    weight = torch.full((rows, head.shape[1]), pad_value, dtype=head.dtype)
    weight[: min(rows, head.shape[0])] = head[:rows]
    new = torch.nn.Linear(head.shape[1], rows, bias=False, dtype=head.dtype)
    new.weight.data = weight
    out.set_output_embeddings(new)
    out.config.tie_word_embeddings = False
    return out


PROMPT_TEXT = "What is the capital of France?"


@pytest.mark.parametrize(
    "target_rows,draft_rows", [(49152, 49152 + 64), (49152 + 128, 49152), (49152 + 64, 49152 + 128)]
)
def test_draft_and_target_with_different_head_rows_decode_exactly(target_rows, draft_rows):
    model, tok = smollm_fp32()
    target = model if target_rows == 49152 else with_head_rows(model, target_rows)
    draft = with_head_rows(model, draft_rows, pad_value=0.5)  # its padding rows would win every argmax
    engine = Engine(target, tok, draft, mode="draft")
    prompt = chat_ids(tok, PROMPT_TEXT)
    reference, _ = engine.decode(prompt, DecodeSettings(mode="target", max_new_tokens=16))
    assert max(reference) < len(tok)  # the target's padding rows are never produced
    tokens, stats = engine.decode(prompt, DecodeSettings(mode="draft", draft_length=3, max_new_tokens=16))
    assert tokens == reference and stats.accepted > 0  # the draft's padding rows were never proposed
    # sampling used to crash here (the draft's and target's distributions had different widths)
    sampled, _ = engine.decode(
        prompt, DecodeSettings(mode="draft", draft_length=3, max_new_tokens=16, temperature=0.8, seed=3)
    )
    assert len(sampled) > 0 and max(sampled) < len(tok)


def test_a_draft_missing_real_tokens_is_refused_with_the_reason():
    model, tok = smollm_fp32()
    short = with_head_rows(model, 40000)
    with pytest.raises(IncompatibleDraftError, match="tokenizer has 49152 tokens.*draft.s head 40000"):
        Engine(model, tok, short, mode="draft")
    small_inputs = copy.deepcopy(model)
    small_inputs.set_input_embeddings(torch.nn.Embedding(40000, model.config.hidden_size))
    with pytest.raises(IncompatibleDraftError, match="embeddings 40000"):
        Engine(model, tok, small_inputs, mode="draft")


def test_head_ids_put_counted_tokens_first_then_merge_order_and_keep_the_specials():
    _, tok = smollm_fp32()
    counts = Counter({40000: 9, 30000: 5, 45000: 1})
    ids = head_ids(tok, 100, counts)
    assert {40000, 30000, 45000} <= set(ids.tolist())
    assert set(tok.all_special_ids) <= set(ids.tolist())
    assert len(ids) == 100 and ids.tolist() == sorted(ids.tolist())  # specials are low ids here: already in
    assert set(range(97)) <= set(ids.tolist())  # the rest by merge order
    assert set(head_ids(tok, 2, counts).tolist()) >= {40000, 30000}  # the most counted first
    replies = [[40000, 5], [30000, 45000]]
    assert coverage(ids, replies) == 1.0
    assert coverage(head_ids(tok, 100), replies) == 0.25  # by merge order alone only token 5 is covered


def test_counts_from_real_replies_round_trip(tmp_path):
    model, tok = smollm_fp32()
    prompts = ["Name a fruit.", "What colour is the sky?", "Say hello."]
    replies = generate_replies(model, tok, prompts, max_new_tokens=8, batch=2, progress=False)
    singles = [engine_reply(model, tok, p) for p in prompts]
    assert replies == singles  # batching (left padding) does not change the greedy replies
    counts = count_tokens(replies)
    assert sum(counts.values()) == sum(map(len, replies)) > 0
    path = tmp_path / "counts.json"
    save_counts(path, counts, {"prompts": 3})
    assert load_counts(path) == counts
    path.write_text("{broken")
    assert load_counts(path) is None and load_counts(tmp_path / "missing.json") is None


def engine_reply(model, tok, text):
    from llm.prompts import SYSTEM

    engine = Engine(model, tok, None, mode="target")
    tokens, _ = engine.decode(chat_ids(tok, text, SYSTEM), DecodeSettings(mode="target", max_new_tokens=8))
    return [t for t in tokens if t not in engine.stop_ids]


def test_shipped_counts_are_used_only_for_the_same_weights(tmp_path):
    """The embedded target's counts ship with the package (building them takes ~30 min on 2 cores); a folder
    whose weights checksum differs gets no shipped counts (its own are built by generating)."""
    shipped = sorted(PACKAGED.glob("*.json"))
    assert shipped, "the embedded target's token counts must ship in llm/token_counts"
    sha = json.loads(shipped[0].read_text())["meta"]["weights_sha256"]
    same, other = tmp_path / "same", tmp_path / "other"
    for folder, digest in ((same, sha), (other, "0" * 64)):
        folder.mkdir()
        (folder / MANIFEST).write_text(json.dumps({"files": {"model.safetensors": {"sha256": digest}}}))
    assert packaged_counts(same) == shipped[0]
    assert packaged_counts(other) is None and packaged_counts(tmp_path) is None
    path = build_counts(str(same))
    assert load_counts(path) == load_counts(shipped[0]) and len(load_counts(path) or ()) > 1000


def test_the_held_out_split_is_fixed_and_never_counted():
    counted, held_out = head_split()
    assert (counted, held_out) == head_split()  # seeded: the same prompts in every build and test
    assert len(held_out) == round(len(VOICE_PROMPTS) * HEAD_HELD_OUT_SHARE)
    assert sorted(counted + held_out) == sorted(VOICE_PROMPTS) and not set(counted) & set(held_out)
    assert not (set(held_out) | set(HELD_OUT)) & set(counted_prompts())


def test_reply_tokens_rank_above_every_human_text_token():
    replies = Counter({7: 1, 8: 3})
    human = Counter({1: 1000, 7: 5, 9: HUMAN_MIN_COUNT, 10: HUMAN_MIN_COUNT - 1})
    ranked = [t for t, _ in corpus_counts(replies, human).most_common()]
    assert ranked == [8, 7, 1, 9]  # replies by count first; a human token seen too rarely gets no row
    assert corpus_counts(replies, None) == replies


def test_the_shipped_head_covers_replies_to_prompts_it_was_never_counted_on():
    """Issue 24: >= 95% of the reply tokens on the held-out split (and on HELD_OUT) fit a 32768-row head. The
    replies are stored token ids (llm/token_counts/replies/, made by `python -m llm.head_coverage --generate`:
    the GGUF target on llama.cpp, greedy, 64 tokens at most), so no model runs here, only its tokenizer."""
    meta = json.loads(SHIPPED.read_text())["meta"]
    assert any(source["name"] == "chitchat-dataset" for source in meta["sources"])
    replies = load_replies()
    assert set(head_split()[1]) | set(HELD_OUT) <= set(replies)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve(TARGET, "llm").path))
    table = {(r.rows, r.set): r.coverage for r in coverage_table(tokenizer, load_counts(SHIPPED) or Counter(), replies)}
    assert table[(32768, "held-out split")] >= 0.95
    assert table[(32768, "HELD_OUT")] >= 0.95
