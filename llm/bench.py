"""`specvoice bench llm`: every decoding method on the same prompts, interleaved, in one run.

Why interleaved: on a shared 2-core machine the speed drifts by tens of percent over minutes; running every
method on prompt 1, then every method on prompt 2, ... makes the drift hit all methods alike, so the ratios
(speedup vs the target alone, in the same run) mean something even when the absolute figures are noisy.

Methods: the target alone (our loop, and transformers `generate`), transformers assisted generation (its
default, and fixed draft lengths, with the plain bf16 draft as a transformers user would run it), and our
decoder (fixed k, adaptive k, token trees at fixed and adaptive depth, n-gram). Greedy, chat template, up to
96 new tokens.
Prints a table, writes JSON (default bench-results/llm.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from llm.engine import DecodeSettings, Engine
from llm.models import load_causal_lm
from llm.speculative import CachedLM

SYSTEM = ("You are a helpful voice assistant. Answer in one to three short spoken sentences, "
          "with no lists, code or markdown.")
PROMPTS = [
    "What's the weather usually like in Paris in spring?",
    "Set a timer for ten minutes and tell me when it's done.",
    "How do I boil an egg so the yolk stays soft?",
    "Tell me a fun fact about octopuses.",
    "What's a good way to fall asleep faster?",
    "Remind me what the capital of Australia is.",
    "Can you explain what a black hole is in simple words?",
    "Give me a quick idea for dinner tonight.",
]


@dataclass
class Result:
    name: str
    tokens: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    verify_calls: int = 0
    verify_tokens: int = 0
    peak_rss_gib: float = 0.0
    identical: list[bool] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return sum(len(t) for t in self.tokens) / max(sum(self.seconds), 1e-9)

    def row(self, base: float) -> dict:
        return {
            "method": self.name, "tokens_per_s": round(self.tokens_per_s, 3),
            "speedup": round(self.tokens_per_s / base, 3) if base else None,
            "accepted_per_drafted": round(self.accepted / self.drafted, 3) if self.drafted else None,
            "mean_accepted_length": round(self.verify_tokens / self.verify_calls, 3) if self.verify_calls else None,
            "ttft_ms": round(1000 * sum(self.ttft) / len(self.ttft), 1) if self.ttft else None,
            "peak_rss_gib": round(self.peak_rss_gib, 2),
            "identical": "".join("y" if s else "n" for s in self.identical),
            "new_tokens": sum(len(t) for t in self.tokens), "seconds": round(sum(self.seconds), 2),
        }


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class _FirstTokenTimer:
    """A transformers streamer that notes when the first generated token arrives (its first put() is the prompt)."""

    def __init__(self):
        self.calls = 0
        self.first: float | None = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.monotonic()

    def end(self):
        pass


def _hf_generate(model, prompt, max_new, stop_ids, **kwargs):
    timer = _FirstTokenTimer()
    ids = torch.tensor([prompt])
    start = time.monotonic()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=sorted(stop_ids), pad_token_id=sorted(stop_ids)[0], streamer=timer,
                             **kwargs)
    end = time.monotonic()
    tokens = out[0, len(prompt):].tolist()
    return tokens, end - start, (timer.first or end) - start


def _load_average() -> list[float]:
    return list(os.getloadavg())


def _positive_ints(text: str) -> list[int]:
    """argparse type for "1,2,3": checked when the flags are read, before any model loads."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers (e.g. 2,3)")
    return values


def main(argv: list[str], *, target: str, draft: str | None, settings: dict) -> int:
    p = argparse.ArgumentParser(prog="specvoice bench llm", description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many of the {len(PROMPTS)} prompts")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--ks", type=_positive_ints, default="1,2,3", help="fixed draft lengths for our decoder")
    p.add_argument("--tree-ks", type=_positive_ints, default="2,3", help="fixed depths for our token-tree decoder")
    p.add_argument("--tree-widths", type=_positive_ints, default=str(settings.get("tree_width", 2)),
                   help="candidates per depth for our token-tree decoder (default: llm.tree_width)")
    p.add_argument("--hf-ks", type=_positive_ints, default="2,3",
                   help="fixed draft lengths for transformers assisted generation")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers reference methods")
    p.add_argument("--only", default="", help="comma-separated method names to run (default: all)")
    p.add_argument("--rounds", type=int, default=1, help="repeat the prompt set (the order rotates each time)")
    p.add_argument("--out", default="bench-results/llm.json")
    args = p.parse_args(argv)

    load_before = _load_average()
    started = time.time()
    mode = "draft" if draft else "ngram"
    engine = Engine.load(target, draft, device=settings.get("device", "cpu"), dtype=settings.get("dtype", "bfloat16"),
                         mode=mode, draft_quantize=settings.get("draft_quantize", "none"),
                         draft_vocab=settings.get("draft_vocab"), threads=settings.get("threads"),
                         context_limit=settings.get("context_limit", 4096))
    hf_draft = None
    if draft and not args.no_hf:
        hf_draft, _ = load_causal_lm(draft, device=settings.get("device", "cpu"),
                                     dtype=settings.get("dtype", "bfloat16"))
    tok = engine.tokenizer
    conv = engine.conversation(SYSTEM)
    prompts = [conv.prompt_ids(conv.messages + [{"role": "user", "content": text}])
               for text in PROMPTS[: args.prompts]]
    n = args.max_new_tokens
    max_k = int(settings.get("max_draft_length", 6))

    methods: list[tuple[str, object]] = [("target alone (ours)", DecodeSettings(mode="target", max_new_tokens=n))]
    if not args.no_hf:
        methods.append(("target alone (transformers generate)", {}))
    if hf_draft is not None:
        methods.append(("transformers assisted (default)", {"assistant_model": hf_draft}))
        for k in args.hf_ks:
            methods.append((f"transformers assisted k={k}", {
                "assistant_model": hf_draft, "num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}))
    if draft:
        for k in args.ks:
            methods.append((f"ours draft k={k}", DecodeSettings(mode="draft", draft_length=k, max_new_tokens=n)))
        methods.append(("ours draft adaptive", DecodeSettings(mode="draft", draft_length="adaptive",
                                                              max_draft_length=max_k, max_new_tokens=n)))
        for width in args.tree_widths:
            for k in args.tree_ks:
                methods.append((f"ours draft tree k={k} w={width}", DecodeSettings(
                    mode="draft", draft_length=k, tree=True, tree_width=width, max_new_tokens=n)))
            methods.append((f"ours draft tree adaptive w={width}", DecodeSettings(
                mode="draft", draft_length="adaptive", max_draft_length=max_k, tree=True, tree_width=width,
                max_new_tokens=n)))
    methods.append(("ours n-gram k=3", DecodeSettings(mode="ngram", draft_length=3, max_new_tokens=n)))
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        methods = [m for m in methods if m[0] in wanted or m[0] == "target alone (ours)"]

    results = {name: Result(name) for name, _ in methods}
    warm = prompts[0]
    engine.decode(warm, DecodeSettings(mode="target", max_new_tokens=4))  # first-call overheads, off the clock
    order = list(range(len(methods)))
    with tqdm(total=args.rounds * len(prompts) * len(methods), desc="bench llm", unit="run", disable=None) as bar:
        for rnd in range(args.rounds):
            for i, prompt in enumerate(prompts):
                # rotate the order on every prompt, so no method always runs first (or right after another)
                shift = (rnd * len(prompts) + i) % len(methods)
                for m in order[shift:] + order[:shift]:
                    name, how = methods[m]
                    bar.set_postfix_str(f"prompt {i + 1}: {name}")
                    res = results[name]
                    if isinstance(how, DecodeSettings):
                        tokens, stats = engine.decode(prompt, how)
                        seconds, ttft = stats.total_s, stats.ttft_s
                        res.drafted += stats.drafted
                        res.accepted += stats.accepted
                        res.verify_calls += max(stats.target_calls - 1, 0)
                        res.verify_tokens += max(stats.new_tokens - 1, 0)
                    else:
                        tokens, seconds, ttft = _hf_generate(engine.target_model, prompt, n, engine.stop_ids, **how)
                    res.tokens.append(tokens)
                    res.seconds.append(seconds)
                    res.ttft.append(ttft)
                    res.peak_rss_gib = _peak_rss_gib()
                    bar.update(1)
    reference = results["target alone (ours)"].tokens
    for res in results.values():
        res.identical = [a == b for a, b in zip(res.tokens, reference)]

    base = results["target alone (ours)"].tokens_per_s
    rows = [r.row(base) for r in results.values()]
    _print_table(rows)
    hf_rows = [r for r in rows if r["method"].startswith("transformers assisted")]
    ours = [r for r in rows if r["method"].startswith("ours draft")]
    summary = {}
    if hf_rows and ours:
        best_hf = max(hf_rows, key=lambda r: r["tokens_per_s"])
        best_ours = max(ours, key=lambda r: r["tokens_per_s"])
        summary = {"best_ours": best_ours["method"], "best_ours_speedup": best_ours["speedup"],
                   "best_transformers_assisted": best_hf["method"],
                   "ours_vs_best_assisted": round(best_ours["tokens_per_s"] / best_hf["tokens_per_s"], 3)}
        print(f"\nbest ours: {best_ours['method']} {best_ours['speedup']:.2f}x vs target alone; "
              f"{summary['ours_vs_best_assisted']:.2f}x vs best transformers assisted ({best_hf['method']})")
    divergences = _divergences(engine, prompts, results)
    for d in divergences:
        print(f"diverged: {d['method']}, prompt {d['prompt'] + 1}, token {d['position']}: target top-2 logit gap "
              f"{d['top2_gap']:.4f} (target alone chose {d['target_token']}, this method {d['method_token']})")
    turns = asyncio.run(_two_turns(engine))
    print(f"conversation: turn 1 ttft {turns[0]['ttft_ms']:.0f} ms (prefill {turns[0]['prefill_tokens']} tokens), "
          f"turn 2 ttft {turns[1]['ttft_ms']:.0f} ms (prefill {turns[1]['prefill_tokens']} of "
          f"{turns[1]['prompt_tokens']} tokens; the rest came from the kept cache)")
    out = {
        "divergences": divergences, "conversation_turns": turns,
        "meta": {"target": target, "draft": draft, "settings": settings, "max_new_tokens": n,
                 "prompts": PROMPTS[: args.prompts], "torch_threads": torch.get_num_threads(),
                 "load_average_before": load_before, "load_average_after": _load_average(),
                 "wall_s": round(time.time() - started, 1), "policy": _policy_state(engine)},
        "results": rows, "summary": summary,
        "tokens": {r.name: r.tokens for r in results.values()},
        "text": {r.name: [tok.decode(t, skip_special_tokens=True) for t in r.tokens] for r in results.values()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}; load average before {load_before[0]:.2f}, after {_load_average()[0]:.2f}")
    return 0


def _divergences(engine: Engine, prompts: list[list[int]], results: dict[str, Result]) -> list[dict]:
    """Where a method's output first differs from the target alone, and how close the target's top two logits
    were there (one target pass over the common prefix)."""
    out = []
    reference = results["target alone (ours)"].tokens
    for name, res in results.items():
        for i, tokens in enumerate(res.tokens):
            ref = reference[i]
            pos = next((j for j, (a, b) in enumerate(zip(ref, tokens)) if a != b), None)
            if pos is None:
                continue
            with engine.lock:
                logits = CachedLM(engine.target_model).logits(prompts[i % len(prompts)] + ref[:pos])[-1]
            top = torch.topk(logits, 2).values
            out.append({"method": name, "prompt": i % len(prompts), "position": pos,
                        "top2_gap": round(float(top[0] - top[1]), 4), "target_token": ref[pos],
                        "method_token": tokens[pos]})
    return out


async def _two_turns(engine: Engine) -> list[dict]:
    """Time to first token of a first and a second turn of one conversation (the second reuses the caches)."""
    conv = engine.conversation(SYSTEM)
    turns = []
    for text in ("What's a good name for a cat?", "And one for a dog?"):
        settings = DecodeSettings(mode=engine.mode, max_new_tokens=12)
        async for _ in conv.reply(text, settings):
            pass
        st = conv.last_stats
        turns.append({"ttft_ms": round(st.ttft_s * 1000, 1), "prefill_tokens": st.prefill_tokens,
                      "prompt_tokens": st.prompt_tokens})
    return turns


def _policy_state(engine: Engine) -> dict:
    policy = engine.policies["draft"]
    return {"alpha": round(policy.alpha, 3), "sibling_beta": round(policy.beta, 3), "draft_step_s": policy.draft_s,
            "verify_s": {str(k): round(v, 4) for k, v in sorted(policy.verify_s.items())}}


def _print_table(rows: list[dict]) -> None:
    cols = [("method", 38), ("tokens_per_s", 8), ("speedup", 8), ("accepted_per_drafted", 9),
            ("mean_accepted_length", 8), ("ttft_ms", 8), ("peak_rss_gib", 8), ("identical", 10)]
    heads = ["method", "tok/s", "speedup", "acc/draft", "mean acc", "ttft ms", "RSS GiB", "identical"]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, (_, w)) in enumerate(zip(heads, cols))))
    for r in rows:
        cells = []
        for i, (key, width) in enumerate(cols):
            v = r[key]
            text = "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
            cells.append(text.ljust(width) if i == 0 else text.rjust(width))
        print("  ".join(cells))
