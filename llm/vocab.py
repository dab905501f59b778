"""The draft's reduced head, chosen from token counts of real replies (FR-Spec).

Why: the draft's output head over all 151,936 tokens is a large share of its weights, and most rows are never
used in a spoken reply (code, other scripts). Keeping the rows of the tokens that replies actually use makes
every draft step cheaper; a token outside the head is never proposed, only produced by the target, so the
output stays exact and only acceptance can suffer. Counting replies (rather than trusting the BPE merge
order) matters because English words in a multilingual vocabulary sit at high ids.

The counts come from the target itself, greedy, on ``counted_prompts()`` (batched, so it takes minutes, not an
hour), and are stored as JSON next to the target's weights (``COUNTS_FILE``), built by
``specvoice models prepare``. When the optional ``chitchat-dataset`` package (open conversational text, MIT) is
installed, its tokens are counted too, ranked below every token of the target's own replies: the replies are the
distribution that matters, human chat only fills the rest of the head with the words a reply might still use
(``corpus_counts``); on prompts it was not counted on, this lifts a 32768-row head from ~95% to ~99% coverage
(``python -m llm.head_coverage``). Generating the replies takes the 1.5B bf16 target most of an hour on a
2-core CPU, so the counts of the embedded default target ship in ``llm/token_counts/`` and are used when the
weights' checksum (from the model folder's manifest) matches; any other target gets its own counts built. The
head is: tokens by count, then the rest by merge order, plus the specials.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from tqdm import tqdm

from llm.prompts import COUNT_PROMPTS, SYSTEM, head_split

log = logging.getLogger("specvoice.llm")

COUNTS_FILE = "specvoice-token-counts.json"
PACKAGED = Path(__file__).parent / "token_counts"  # counts shipped for the embedded default target
MANIFEST = "specvoice-manifest.json"  # file checksums written by `models prepare` next to the weights
HUMAN_TEXT = "chitchat-dataset"  # the optional PyPI package of open conversational text (MIT), counts only
HUMAN_MIN_COUNT = 1  # every token the human text has: dropping those seen once cost ~1 point of held-out coverage


def counted_prompts() -> list[str]:
    """The prompts whose replies are counted: never any of ``head_split``'s held-out share."""
    return COUNT_PROMPTS + head_split()[0]


def counts_path(target_location: str) -> Path | None:
    """Where a target folder's token counts live (None for a hub model: there is no folder to keep them in)."""
    return None if target_location.startswith("hub:") else Path(target_location) / COUNTS_FILE


def chat_prompt(tokenizer, user: str, system: str = SYSTEM) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": user}],
        add_generation_prompt=True,
        tokenize=True,
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@torch.no_grad()
def generate_replies(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int = 64,
    batch: int = 8,
    system: str = SYSTEM,
    progress: bool = True,
) -> list[list[int]]:
    """Greedy replies of ``model`` to prompts, in batches (left-padded), stop tokens removed.

    Batched because a CPU forward over 8 sequences costs little more than over one (decoding is bound by
    reading the weights), so the corpus takes about an eighth of the time.
    """
    stop = {tokenizer.eos_token_id, *_listify(getattr(model.generation_config, "eos_token_id", None))} - {None}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop)
    replies: list[list[int]] = []
    for i in tqdm(range(0, len(prompts), batch), desc="replies", unit="batch", disable=not progress or None):
        ids = [chat_prompt(tokenizer, p, system) for p in prompts[i : i + batch]]
        width = max(map(len, ids))
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        out = model.generate(
            input_ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(stop),
            pad_token_id=pad,
        )
        for row in out[:, width:].tolist():
            reply = []
            for t in row:
                if t in stop:
                    break
                reply.append(t)
            replies.append(reply)
    return replies


def _listify(value) -> list:
    return value if isinstance(value, list) else [value]


def count_tokens(replies: Iterable[list[int]]) -> Counter[int]:
    counts: Counter[int] = Counter()
    for reply in replies:
        counts.update(reply)
    return counts


def human_text_counts(tokenizer, progress: bool = True) -> tuple[Counter[int], dict[str, object]] | None:
    """(token counts, what they are) of the chit-chat corpus on PyPI, or None when it is not installed.

    Every message of every conversation, tokenized on its own (no chat template: it is text, not a reply).
    """
    try:
        import chitchat_dataset
    except ImportError:
        log.info("no human text counted", extra={"package": HUMAN_TEXT, "fix": "pip install specvoice[counts]"})
        return None
    from importlib.metadata import version

    conversations = json.loads(Path(chitchat_dataset._PATH).read_text()).values()
    texts = [" ".join(u["text"] for u in message) for c in conversations for message in c["messages"]]
    counts: Counter[int] = Counter()
    for i in tqdm(range(0, len(texts), 2000), desc=HUMAN_TEXT, unit="batch", disable=not progress or None):
        counts.update(t for ids in tokenizer(texts[i : i + 2000], add_special_tokens=False)["input_ids"] for t in ids)
    about = {"name": HUMAN_TEXT, "version": version(HUMAN_TEXT), "licence": "MIT", "messages": len(texts)}
    return counts, {**about, "tokens": sum(counts.values()), "distinct": len(counts)}


def corpus_counts(replies: Counter[int], human: Counter[int] | None = None) -> Counter[int]:
    """One ranking: every token of the target's replies (by count), then the human text's (by count, at least
    ``HUMAN_MIN_COUNT``). Done by scaling the reply counts above the largest human count, so the file stays a
    plain token -> count map that ``head_ids`` reads as before."""
    if not human:
        return Counter(replies)
    scale = max(human.values()) + 1
    out = Counter({t: c for t, c in human.items() if c >= HUMAN_MIN_COUNT})
    for t, c in replies.items():
        out[t] = c * scale + human.get(t, 0)
    return out


def save_counts(path: Path, counts: Counter[int], meta: dict) -> None:
    """Write atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"meta": meta, "counts": {str(k): v for k, v in counts.most_common()}}))
    tmp.replace(path)


def packaged_counts(folder: Path) -> Path | None:
    """The shipped counts made from exactly these weights (same safetensors checksum), if any."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
        sha = files["model.safetensors"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for candidate in sorted(PACKAGED.glob("*.json")):
        try:
            if json.loads(candidate.read_text())["meta"].get("weights_sha256") == sha:
                return candidate
        except (ValueError, KeyError, TypeError):
            continue
    return None


def load_counts(path: Path | None) -> Counter[int] | None:
    if path is None or not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return Counter({int(k): int(v) for k, v in data["counts"].items()})
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("unreadable token counts, ignored", extra={"path": str(path), "error": str(exc)})
        return None


def head_ids(tokenizer, n: int, counts: Counter[int] | None = None) -> torch.Tensor:
    """The ids of an n-row reduced head, sorted: the counted tokens by count, then the rest by merge order (a
    low id was merged early, i.e. is frequent in the tokenizer's corpus), plus every special token."""
    vocab = len(tokenizer)
    special = {i for i in tokenizer.all_special_ids if i is not None and i < vocab}
    special |= {i for i in tokenizer.get_added_vocab().values() if i < vocab}
    chosen = [t for t, _ in (counts or Counter()).most_common() if t < vocab][:n]
    seen = set(chosen)
    for t in range(vocab):
        if len(chosen) >= n:
            break
        if t not in seen:
            chosen.append(t)
    return torch.tensor(sorted(set(chosen) | special), dtype=torch.long)


def draft_head(tokenizer, target_location: str, n: int, token_counts: str | None = None) -> tuple[torch.Tensor, str]:
    """(ids, how they were chosen) of the draft's n-row head: from the target's token counts (or the given
    file) when they exist, else by merge order."""
    counts = load_counts(Path(token_counts) if token_counts else counts_path(target_location))
    return head_ids(tokenizer, n, counts), "counts" if counts else "merge order"


def head_key(ids: torch.Tensor | None) -> str:
    """A short name for a head's ids (the quantized-layer cache is per head)."""
    return "full" if ids is None else hashlib.sha1(ids.numpy().tobytes()).hexdigest()[:16]


def coverage(ids: torch.Tensor, replies: Iterable[list[int]]) -> float:
    """The share of reply tokens that a head with these ids could propose."""
    keep = set(ids.tolist())
    tokens = [t for reply in replies for t in reply]
    return sum(t in keep for t in tokens) / len(tokens) if tokens else 1.0


def build_counts(
    target_location: str, *, max_new_tokens: int = 64, batch: int = 8, force: bool = False, dtype: str = "bfloat16"
) -> Path | None:
    """Generate the count corpus with the target and store the counts in its folder; returns the file (None for
    a hub model). Skipped when the file exists, unless force."""
    from llm.models import load_causal_lm

    path = counts_path(target_location)
    if path is None or (path.exists() and not force and load_counts(path) is not None):
        return path
    packaged = packaged_counts(Path(target_location))
    if packaged is not None and not force:
        path.write_bytes(packaged.read_bytes())
        log.info("token counts from the package", extra={"path": str(path), "source": packaged.name})
        return path
    start = time.monotonic()
    model, tokenizer = load_causal_lm(target_location, dtype=dtype)
    prompts = counted_prompts()
    replies = count_tokens(generate_replies(model, tokenizer, prompts, max_new_tokens, batch))
    human = human_text_counts(tokenizer)
    generated = f"greedy, transformers {dtype}, max_new_tokens {max_new_tokens}"
    meta = counts_meta(replies, len(prompts), generated, human[1] if human else None)
    save_counts(path, corpus_counts(replies, human[0] if human else None), {**meta, "seconds": elapsed(start)})
    log.info("token counts built", extra={"path": str(path), "tokens": meta["tokens"]})
    return path


def counts_meta(
    replies: Counter[int], prompts: int, generated: str, human: dict[str, object] | None
) -> dict[str, object]:
    """What went into a counts file: the reply corpus and, if counted, the human text."""
    sources: list[dict[str, object]] = [
        {"name": "replies", "prompts": prompts, "tokens": sum(replies.values()), "generated": generated}
    ]
    return {
        "prompts": prompts,
        "tokens": sum(replies.values()),
        "distinct": len(replies),
        "sources": sources + ([human] if human else []),
        "ranking": "reply tokens by count, then human-text tokens seen at least "
        f"{HUMAN_MIN_COUNT} times by count (corpus_counts)",
    }


def elapsed(start: float) -> float:
    return round(time.monotonic() - start, 1)
