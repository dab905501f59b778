"""The weights in huge pages (llm.huge_pages): the ranges a load mapped are found even where the kernel merged
them into a neighbour, the real GGUF ends up collapsed where the kernel allows it (else the load says why and
goes on), and the tokens do not change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llm.huge_pages import MIN_MAPPING, anonymous_mappings, collapse_new, new_ranges
from llm.llamacpp import GgufModel, LlamaCppLM
from voice.models import resolve

M = MIN_MAPPING
ROOT = Path(__file__).resolve().parent.parent


def test_new_ranges_are_what_the_load_added_even_inside_a_merged_mapping():
    assert new_ranges({}, {0: 3 * M}) == [(0, 3 * M)]
    assert new_ranges({0: M}, {0: 3 * M}) == [(M, 2 * M)], "the kernel extended an older mapping"
    assert new_ranges({M: M}, {0: 3 * M}) == [(0, M), (2 * M, M)], "grown on both sides"
    assert new_ranges({0: 3 * M}, {0: 3 * M}) == [], "nothing new"
    assert new_ranges({0: M}, {0: M + 4096}) == [], "a few pages more is not a weight buffer"


def thp_mode() -> str:
    text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    return text[text.index("[") + 1 : text.index("]")]


def test_a_gguf_loaded_at_start_is_in_huge_pages():
    """As a service loads its model: in a fresh process (in this long-lived one, the load may reuse memory that
    earlier tests freed, which leaves no new range to find)."""
    path = resolve("smollm2-135m-instruct", "llm", engine="llama.cpp").path
    script = (
        "import sys; from llm.llamacpp import GgufModel; "
        f"m = GgufModel.load({str(path)!r}, threads=1, context_limit=256, batch=32, huge_pages=True); "
        "print(m.huge.bytes, repr(m.huge.why_not))"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    collapsed, why_not = run.stdout.split()[-2], run.stdout.split(maxsplit=1)[-1].strip()
    gguf = Path(path) / "model.gguf" if Path(path).is_dir() else Path(path)
    if thp_mode() == "never":
        assert int(collapsed) == 0 and why_not != "''", run.stdout
    else:
        assert why_not == "''" and int(collapsed) >= 0.8 * gguf.stat().st_size, run.stdout


def test_huge_pages_leave_the_tokens_as_they_were():
    path = resolve("smollm2-135m-instruct", "llm", engine="llama.cpp").path
    small = GgufModel.load(path, threads=1, context_limit=256, batch=32, huge_pages=False)
    huge = GgufModel.load(path, threads=1, context_limit=256, batch=32, huge_pages=True)
    assert small.huge.bytes == 0
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
