"""The weights in huge pages (llm.huge_pages): the ranges a load mapped are found even where the kernel merged
them into a neighbour, the real GGUF ends up collapsed where the kernel allows it (else the load says why and
goes on), and the tokens do not change."""

from __future__ import annotations

from pathlib import Path

from llm.huge_pages import MIN_MAPPING, anonymous_mappings, collapse_new, new_ranges
from llm.llamacpp import GgufModel, LlamaCppLM
from voice.models import resolve

M = MIN_MAPPING


def test_new_ranges_are_what_the_load_added_even_inside_a_merged_mapping():
    assert new_ranges({}, {0: 3 * M}) == [(0, 3 * M)]
    assert new_ranges({0: M}, {0: 3 * M}) == [(M, 2 * M)], "the kernel extended an older mapping"
    assert new_ranges({M: M}, {0: 3 * M}) == [(0, M), (2 * M, M)], "grown on both sides"
    assert new_ranges({0: 3 * M}, {0: 3 * M}) == [], "nothing new"
    assert new_ranges({0: M}, {0: M + 4096}) == [], "a few pages more is not a weight buffer"


def thp_mode() -> str:
    text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    return text[text.index("[") + 1 : text.index("]")]


def test_a_loaded_gguf_is_in_huge_pages_and_decodes_the_same_tokens():
    path = resolve("smollm2-135m-instruct", "llm", engine="llama.cpp").path
    small = GgufModel.load(path, threads=1, context_limit=256, batch=32, huge_pages=False)
    huge = GgufModel.load(path, threads=1, context_limit=256, batch=32, huge_pages=True)
    assert small.huge.bytes == 0
    file_bytes = (
        sum(f.stat().st_size for f in Path(path).rglob("*.gguf")) if Path(path).is_dir() else Path(path).stat().st_size
    )
    if thp_mode() == "never":
        assert huge.huge.bytes == 0 and huge.huge.why_not, huge.huge
    else:
        assert huge.huge.why_not == "" and huge.huge.bytes >= 0.8 * file_bytes, huge.huge
    prompt = list(range(200, 230))
    outputs = []
    for model in (small, huge):
        lm, seq = LlamaCppLM(model), list(prompt)
        for _ in range(12):
            seq.append(lm.greedy(seq)[-1])
        outputs.append(seq)
        lm.close()
    assert outputs[0] == outputs[1]
    small.close()
    huge.close()


def test_nothing_new_to_collapse_says_so():
    assert collapse_new(anonymous_mappings()).why_not == "no new mapping found"
