"""How much of the target's replies the draft's reduced head covers, on prompts its counts never saw.

    python -m llm.head_coverage --target DIR [--out FILE]    # the table (head size x prompt set), and JSON
    python -m llm.head_coverage --target DIR --generate --gguf FILE  # first the missing replies (llama.cpp)
    python -m llm.head_coverage --target DIR --build-counts OLD      # also rewrite the shipped counts

DIR is the target's folder and FILE its GGUF (under ~/.cache/specvoice after `make`): the llm package does not
know where voice/ keeps its models, so they are named here.

Why a module of its own: ``bench llm`` reports coverage on the replies to its eight prompts, as a side effect of
timing; this measures it where it matters, on a fixed, seeded held-out share of ``prompts.VOICE_PROMPTS`` (never
counted, ``prompts.head_split``) and on ``prompts.HELD_OUT``, for several head sizes, so the trade-off between
a smaller head (a cheaper draft step) and coverage (a token outside the head is never proposed) is known.

The replies are the embedded target's GGUF on llama.cpp, greedy, at most 64 tokens: about seven times faster
than the bf16 torch target on a 2-core CPU; greedy GGUF replies differ from bf16 ones in a few tokens. They are
kept per prompt, as token ids, in ``REPLIES``: a rerun only generates what is missing, and the test reads them
without loading a model.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from llm.prompts import COUNT_PROMPTS, HELD_OUT, head_split
from llm.vocab import (
    MANIFEST,
    PACKAGED,
    corpus_counts,
    count_tokens,
    counts_meta,
    coverage,
    elapsed,
    head_ids,
    human_text_counts,
    load_counts,
    save_counts,
)

log = logging.getLogger("specvoice.llm")

TARGET = "qwen2.5-coder-1.5b-instruct"  # the embedded target: the one whose counts ship
SHIPPED = PACKAGED / f"{TARGET}.json"
REPLIES = PACKAGED / "replies" / f"{TARGET}.json"  # not globbed by packaged_counts (a subfolder)
HEAD_SIZES = (16384, 32768, 65536)
MAX_NEW_TOKENS = 64
GENERATED = f"greedy, llama.cpp on the embedded GGUF, max_new_tokens {MAX_NEW_TOKENS}"


def prompt_sets() -> dict[str, list[str]]:
    """The sets the table reports, by name; only the last one was counted."""
    counted, held_out = head_split()
    return {"held-out split": held_out, "HELD_OUT": HELD_OUT, "counted split": counted}


@dataclass
class Row:
    rows: int
    set: str
    prompts: int
    tokens: int
    coverage: float


def load_replies(path: Path = REPLIES) -> dict[str, list[int]]:
    """prompt -> the target's reply token ids (empty when there is no file yet)."""
    return json.loads(path.read_text())["replies"] if path.exists() else {}


def generate_missing(gguf: str, prompts: list[str], path: Path = REPLIES) -> dict[str, list[int]]:
    """Generate the replies not yet in ``path``, saving after each one (a long run can be stopped and resumed)."""
    from llm.engine import DecodeSettings
    from llm.llamacpp_engine import LlamaCppEngine
    from llm.vocab import chat_prompt

    replies = load_replies(path)
    missing = [p for p in prompts if p not in replies]
    if not missing:
        return replies
    engine = LlamaCppEngine.load_gguf(gguf, mode="target", calibrate=False)
    settings = DecodeSettings(mode="target", max_new_tokens=MAX_NEW_TOKENS)
    path.parent.mkdir(parents=True, exist_ok=True)
    for prompt in tqdm(missing, desc="replies", unit="prompt", disable=None):
        tokens, _ = engine.decode(chat_prompt(engine.tokenizer, prompt), settings)
        replies[prompt] = [t for t in tokens if t not in engine.stop_ids]
        path.write_text(json.dumps({"meta": {"model": TARGET, "generated": GENERATED}, "replies": replies}))
    return replies


def coverage_table(tokenizer, counts: Counter[int], replies: dict[str, list[int]]) -> list[Row]:
    """Coverage of an n-row head chosen from ``counts``, for every head size and prompt set with replies."""
    out = []
    for n in HEAD_SIZES:
        ids = head_ids(tokenizer, n, counts)
        for name, prompts in prompt_sets().items():
            have = [replies[p] for p in prompts if p in replies]
            if have:
                tokens = sum(map(len, have))
                out.append(Row(n, name, len(have), tokens, round(coverage(ids, have), 4)))
    return out


def build_shipped(target: Path, old_counts: Path, replies: dict[str, list[int]]) -> dict[str, object]:
    """Rewrite ``SHIPPED``: the previous build's counts of the bf16 target's replies to ``COUNT_PROMPTS`` (read
    from ``old_counts``, so those 196 replies need not be generated again: ~30 min; the last replies-only build
    is ``git show e543607:llm/token_counts/qwen2.5-coder-1.5b-instruct.json``), plus the GGUF replies to the
    counted split that ``REPLIES`` holds, plus the human text; the meta keeps the checksum of the bf16 weights,
    which is what ``packaged_counts`` matches. Returns the meta."""
    from transformers import AutoTokenizer

    start = time.monotonic()
    old = json.loads(old_counts.read_text())
    if old["meta"].get("prompts") != len(COUNT_PROMPTS) or "sources" in old["meta"]:
        raise ValueError(f"{old_counts} is not a replies-only count of the {len(COUNT_PROMPTS)} COUNT_PROMPTS")
    counted = head_split()[0]
    done = [p for p in counted if p in replies]  # all of them after --generate; fewer if a run was cut short
    if len(done) < len(counted):
        log.warning("counting part of the counted split", extra={"replies": len(done), "prompts": len(counted)})
    bf16 = Counter({int(k): int(v) for k, v in old["counts"].items()})
    gguf = count_tokens(replies[p] for p in done)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    human = human_text_counts(tokenizer)
    if human is None:
        raise ValueError("the shipped counts include the human text; fix: pip install specvoice[counts]")
    meta = counts_meta(bf16 + gguf, len(COUNT_PROMPTS) + len(done), "see sources", human[1])
    meta["sources"] = [
        {
            "name": "replies to COUNT_PROMPTS",
            "prompts": len(COUNT_PROMPTS),
            "tokens": sum(bf16.values()),
            "generated": f"greedy, transformers {old['meta'].get('dtype')}, max_new_tokens "
            f"{old['meta'].get('max_new_tokens')} (the previous build, {old['meta'].get('seconds')} s)",
        },
        {
            "name": "replies to the counted split of VOICE_PROMPTS",
            "prompts": len(done),
            "of": len(counted),
            "tokens": sum(gguf.values()),
            "generated": GENERATED,
        },
        human[1],
    ]
    manifest = json.loads((target / MANIFEST).read_text())
    meta["weights_sha256"] = manifest["files"]["model.safetensors"]["sha256"]
    meta["model"] = old["meta"].get("model", TARGET)
    meta["seconds"] = elapsed(start)  # the counting only; the GGUF replies took their own time (REPLIES)
    save_counts(SHIPPED, corpus_counts(bf16 + gguf, human[0]), meta)
    return meta


def _print(rows: list[Row]) -> None:
    sets = list(dict.fromkeys(r.set for r in rows))
    print("head rows  " + "  ".join(f"{s:>16}" for s in sets))
    for n in HEAD_SIZES:
        cells = {r.set: f"{100 * r.coverage:.1f}%" for r in rows if r.rows == n}
        print(f"{n:>9}  " + "  ".join(f"{cells.get(s, '-'):>16}" for s in sets))
    sizes = {r.set: f"{r.prompts} prompts, {r.tokens} tokens" for r in rows if r.rows == HEAD_SIZES[0]}
    print("; ".join(f"{s}: {v}" for s, v in sizes.items()))


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    p = argparse.ArgumentParser(prog="python -m llm.head_coverage", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--counts", default=str(SHIPPED), help="the token counts file to choose the head from")
    p.add_argument("--generate", action="store_true", help="generate the missing replies with llama.cpp first")
    p.add_argument("--build-counts", metavar="OLD", help="rewrite the shipped counts; OLD: build_shipped's file")
    p.add_argument("--out", default="bench-results/head-coverage.json", help="JSON file")
    p.add_argument(
        "--target",
        required=True,
        type=Path,
        help=f"the {TARGET} folder (tokenizer, bf16 weights), e.g. ~/.cache/specvoice/{TARGET} after `make`",
    )
    p.add_argument("--gguf", type=Path, help=f"its GGUF, for --generate, e.g. ~/.cache/specvoice/{TARGET}.gguf")
    args = p.parse_args(argv)
    target: Path = args.target
    if args.generate and args.gguf is None:
        p.error("--generate needs --gguf")
    all_prompts = [q for prompts in prompt_sets().values() for q in prompts]
    started = time.monotonic()
    replies = generate_missing(str(args.gguf), all_prompts) if args.generate else load_replies()
    generation_s = elapsed(started)
    built = build_shipped(target, Path(args.build_counts), replies) if args.build_counts else None
    counts = load_counts(Path(args.counts))
    if counts is None:
        raise SystemExit(f"no token counts in {args.counts}")
    rows = coverage_table(AutoTokenizer.from_pretrained(str(target)), counts, replies)
    _print(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "counts": args.counts,
        "counts_meta": json.loads(Path(args.counts).read_text())["meta"],
        "replies": GENERATED,
        "generation_s": generation_s if args.generate else None,
        "built": built,
        "rows": [asdict(r) for r in rows],
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
