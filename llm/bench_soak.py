"""A long conversation: time to first token per decile of turns (`specvoice bench llm --conversation N`).

What it checks: that the prompt cache survives history trimming. Short user turns, replies capped (28 tokens
by default, to keep 100 turns affordable), the configured decoder. After each reply the conversation is
warmed as the product should do while the reply is spoken (``Conversation.warm``: it trims ahead of time
and prefills the kept history); ``--no-warm`` measures without it, and ``--trim-to 1`` reproduces the old
trimming (drop just enough, every turn once over budget). Goal: p95 TTFT over the last decile within 1.5x of
the first decile. Prints a table and writes JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from llm.engine import Engine
from llm.load import load_engine
from llm.prompts import COUNT_PROMPTS, HELD_OUT, SYSTEM
from llm.settings import HISTORY_TOKENS, LoadSettings


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (q in 0..100), as numpy's default."""
    s = sorted(values)
    if not s:
        return 0.0
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


async def converse(
    engine: Engine,
    turns: int,
    *,
    max_new_tokens: int = 28,
    history_tokens: int = HISTORY_TOKENS,
    trim_to: float = 0.5,
    warm: bool = True,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run one conversation of ``turns`` short turns; one record per turn."""
    conv = engine.conversation(SYSTEM, history_tokens)
    conv.trim_to = trim_to
    settings = engine.settings.but(max_new_tokens=max_new_tokens)
    users = HELD_OUT + COUNT_PROMPTS
    records = []
    if warm:
        await conv.warm()
    for i in tqdm(range(turns), desc="conversation", unit="turn", disable=not progress or None):
        trims = conv.trims
        async for _ in conv.reply(users[i % len(users)], settings):
            pass
        st = conv.last_stats
        assert st is not None
        warm_s = 0.0
        if warm:
            start = time.monotonic()
            await conv.warm()
            warm_s = time.monotonic() - start
        records.append(
            {
                "turn": i + 1,
                "ttft_s": st.ttft_s,
                "prefill_tokens": st.prefill_tokens,
                "prompt_tokens": st.prompt_tokens,
                "new_tokens": st.new_tokens,
                "decode_tokens_per_s": st.decode_tokens_per_s,
                "trimmed": conv.trims > trims,
                "warm_s": warm_s,
            }
        )
    return records


def deciles(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    n = len(records)
    rows = []
    for d in range(10):
        part = records[d * n // 10 : (d + 1) * n // 10]
        if not part:
            continue
        ttft = [r["ttft_s"] for r in part]
        rows.append(
            {
                "decile": d + 1,
                "turns": f"{part[0]['turn']}-{part[-1]['turn']}",
                "ttft_p50_ms": round(1000 * percentile(ttft, 50)),
                "ttft_p95_ms": round(1000 * percentile(ttft, 95)),
                "prefill_mean": round(statistics.mean(r["prefill_tokens"] for r in part)),
                "prompt_mean": round(statistics.mean(r["prompt_tokens"] for r in part)),
                "trims": sum(r["trimmed"] for r in part),
                "warm_max_s": round(max(r["warm_s"] for r in part), 2),
            }
        )
    return rows


def run(
    turns: int,
    *,
    target: str,
    draft: str | None,
    settings: dict[str, Any],
    out: str,
    max_new_tokens: int = 28,
    history_tokens: int = HISTORY_TOKENS,
    trim_to: float = 0.5,
    warm: bool = True,
) -> int:
    started = time.time()
    mode = LoadSettings.from_config(settings).mode if draft else "ngram"
    engine = load_engine(target, draft, {**settings, "mode": mode})
    records = asyncio.run(
        converse(
            engine, turns, max_new_tokens=max_new_tokens, history_tokens=history_tokens, trim_to=trim_to, warm=warm
        )
    )
    rows = deciles(records)
    print(
        f"{'decile':>6} {'turns':>8} {'p50 ms':>7} {'p95 ms':>7} {'prefill':>8} {'prompt':>7} {'trims':>5} "
        f"{'warm max s':>10}"
    )
    for r in rows:
        print(
            f"{r['decile']:>6} {r['turns']:>8} {r['ttft_p50_ms']:>7} {r['ttft_p95_ms']:>7} {r['prefill_mean']:>8} "
            f"{r['prompt_mean']:>7} {r['trims']:>5} {r['warm_max_s']:>10}"
        )
    ratio = rows[-1]["ttft_p95_ms"] / max(rows[0]["ttft_p95_ms"], 1)
    print(f"p95 ttft, last decile / first decile: {ratio:.2f} (goal <= 1.5)")
    result = {
        "deciles": rows,
        "p95_ratio_last_first": round(ratio, 3),
        "turns": records,
        "meta": {
            "target": target,
            "draft": draft,
            "settings": settings,
            "warm": warm,
            "trim_to": trim_to,
            "history_tokens": history_tokens,
            "max_new_tokens": max_new_tokens,
            "engine": engine.info,
            "load_average_after": list(os.getloadavg()),
            "wall_s": round(time.time() - started, 1),
        },
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0
