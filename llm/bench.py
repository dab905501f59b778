"""`specvoice bench llm`: every decoding method on the same prompts, interleaved, in one run.

Why interleaved: on a shared 2-core machine the speed drifts by tens of percent over minutes; running every
method on prompt 1, then every method on prompt 2, ... (in a fresh seeded order each time) makes the drift hit
all methods alike, so the ratios (speedup vs the target alone, in the same run) mean something even when the absolute
figures are noisy.

Two speeds per method: decode-phase tokens/s (tokens after the first / time from the first token to the last)
and time to first token, reported apart: prefill is the same work for every method, and folding it into
tokens/s hides the decode-phase gain that speculation is for.

Methods: the target alone (our loop), ``ours default`` (the config's engine and draft settings, as the product
runs them), and the peer a user of that engine already has: on llama.cpp, ``llama.cpp target alone`` (llama.cpp's
own generation loop through llama-cpp-python's high-level API, same GGUF, same threads); on torch, transformers
`generate` and assisted generation (its default and fixed draft lengths, with the plain bf16 draft as a
transformers user would run it). Then our decoder's variants (fixed k, adaptive k, confidence stop, token trees
on torch, n-gram). Greedy, chat template. On llama.cpp the engine's calibration (which drafter pays on this
device, from measured pass costs) is printed and saved.
Prints a table, writes JSON (default bench-results/llm.json). ``--conversation N`` runs the long-conversation
benchmark instead (bench_soak.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from llm.bench_peers import LlamaCppAlone, hf_generate
from llm.engine import DecodeSettings, Engine
from llm.load import load_engine
from llm.models import load_causal_lm
from llm.prompts import SYSTEM
from llm.settings import LoadSettings
from llm.vocab import coverage

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
BASE = "target alone (ours)"
DEFAULT = "ours default"
LLAMA_CPP_ALONE = "llama.cpp target alone"


@dataclass
class Result:
    name: str
    tokens: list[list[int]] = field(default_factory=list)
    decode_tokens: int = 0  # tokens after the first, summed over runs
    decode_s: float = 0.0  # time from the first token to the last, summed over runs
    ttft: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    verify_calls: int = 0
    verify_tokens: int = 0
    peak_rss_gib: float = 0.0
    rss_gib: float = 0.0  # the process's resident memory after this method's runs (highest seen)
    draft_lengths: Counter[int] = field(default_factory=Counter)  # how often each k was drafted (verify steps)
    run_rates: list[float] = field(default_factory=list)  # decode tokens/s of each run, in the order they ran
    identical: list[bool] = field(default_factory=list)

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / max(self.decode_s, 1e-9)

    def row(self, base: float, best_hf: float | None) -> dict[str, Any]:
        rate = self.decode_tokens_per_s
        return {
            "method": self.name,
            "decode_tokens_per_s": round(rate, 3),
            "speedup": round(rate / base, 3) if base else None,
            "vs_best_assisted": round(rate / best_hf, 3) if best_hf else None,
            "alpha": round(self.accepted / (self.accepted + self.rejections), 3) if self.drafted else None,
            "accepted_per_drafted": round(self.accepted / self.drafted, 3) if self.drafted else None,
            "mean_accepted_length": round(self.verify_tokens / self.verify_calls, 3) if self.verify_calls else None,
            "ttft_ms": round(1000 * sum(self.ttft) / len(self.ttft), 1) if self.ttft else None,
            "peak_rss_gib": round(self.peak_rss_gib, 2),
            "rss_gib": round(self.rss_gib, 2),
            "draft_lengths": {str(k): n for k, n in sorted(self.draft_lengths.items())},
            "run_decode_tokens_per_s": [round(r, 2) for r in self.run_rates],
            "identical": "".join("y" if s else "n" for s in self.identical),
            "new_tokens": sum(len(t) for t in self.tokens),
            "decode_s": round(self.decode_s, 2),
        }


def _rss_gib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def _positive_ints(text: str) -> list[int]:
    """argparse type for "1,2,3": checked when the flags are read, before any model loads."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers (e.g. 2,3)")
    return values


def _parser(settings: dict[str, Any]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specvoice bench llm", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many of the {len(PROMPTS)} prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--ks", type=_positive_ints, default="2,3", help="fixed draft lengths for our decoder")
    p.add_argument("--tree-ks", type=_positive_ints, default="2", help="fixed depths for our token-tree decoder")
    p.add_argument(
        "--tree-widths",
        type=_positive_ints,
        default=str(DecodeSettings.from_config(settings).tree_width),
        help="candidates per depth for our token-tree decoder (default: llm.tree_width)",
    )
    p.add_argument(
        "--hf-ks", type=_positive_ints, default="2,3", help="fixed draft lengths for transformers assisted generation"
    )
    p.add_argument("--no-hf", action="store_true", help="skip the transformers reference methods")
    p.add_argument("--no-tree", action="store_true", help="skip the token-tree methods")
    p.add_argument("--only", default="", help="comma-separated method names to run (default: all)")
    p.add_argument("--rounds", type=int, default=2, help="repeat the prompt set (the order rotates each time)")
    p.add_argument(
        "--conversation",
        type=int,
        default=0,
        metavar="TURNS",
        help="run the long-conversation benchmark (time to first token per decile of turns) instead",
    )
    p.add_argument(
        "--quality",
        action="store_true",
        help="measure the int4 served target against the bf16 reference instead (quality.py)",
    )
    p.add_argument("--soak-max-new-tokens", type=int, default=28, help="--conversation: reply cap per turn")
    p.add_argument("--history-tokens", type=int, default=1536, help="--conversation: history budget")
    p.add_argument(
        "--trim-to",
        type=float,
        default=0.5,
        help="--conversation: share of the budget kept after a trim (1: the old drop-just-enough)",
    )
    p.add_argument("--no-warm", action="store_true", help="--conversation: no warm-up between turns")
    p.add_argument("--out", default="", help="JSON file (default bench-results/llm.json, or llm-soak.json)")
    return p


def _methods(args, engine: Engine, hf_draft, settings: dict[str, Any]) -> list[tuple[str, Any]]:
    n, max_k = args.max_new_tokens, DecodeSettings.from_config(settings).max_draft_length
    llama = LoadSettings.from_config(settings).engine_kind == "llama.cpp"
    methods: list[tuple[str, Any]] = [(BASE, DecodeSettings(mode="target", max_new_tokens=n))]
    methods.append((DEFAULT, DecodeSettings.from_config(settings).but(max_new_tokens=n)))
    if llama:
        threads = int(engine.info.get("threads", 1))
        methods.append((LLAMA_CPP_ALONE, LlamaCppAlone(engine.info["target"], threads, engine.context_limit)))
    elif not args.no_hf:
        methods.append(("target alone (transformers generate)", {}))
    if hf_draft is not None:
        methods.append(("transformers assisted (default)", {"assistant_model": hf_draft}))
        for k in args.hf_ks:
            methods.append(
                (
                    f"transformers assisted k={k}",
                    {
                        "assistant_model": hf_draft,
                        "num_assistant_tokens": k,
                        "num_assistant_tokens_schedule": "constant",
                        "assistant_confidence_threshold": 0.0,
                    },
                )
            )
    if engine.draft_model is not None:
        for k in args.ks:
            methods.append((f"ours draft k={k}", DecodeSettings(mode="draft", draft_length=k, max_new_tokens=n)))
    if engine.draft_model is not None and not llama:  # on llama.cpp these are "ours default" (the engine decides)
        methods.append(
            (
                "ours draft adaptive",
                DecodeSettings(mode="draft", draft_length="adaptive", max_draft_length=max_k, max_new_tokens=n),
            )
        )
        methods.append(
            (
                "ours draft confidence",
                DecodeSettings(mode="draft", draft_length="confidence", max_draft_length=8, max_new_tokens=n),
            )
        )
        for width in [] if args.no_tree else args.tree_widths:
            for k in args.tree_ks:
                methods.append(
                    (
                        f"ours draft tree k={k} w={width}",
                        DecodeSettings(mode="draft", draft_length=k, tree=True, tree_width=width, max_new_tokens=n),
                    )
                )
    methods.append(("ours n-gram k=3", DecodeSettings(mode="ngram", draft_length=3, max_new_tokens=n)))
    methods.append(("ours n-gram adaptive", DecodeSettings(mode="ngram", draft_length="adaptive", max_new_tokens=n)))
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        methods = [m for m in methods if m[0] in wanted or m[0] == BASE]
    names = [name for name, _ in methods]
    return [m for i, m in enumerate(methods) if m[0] not in names[:i]]  # a name once (the default may be a variant)


def _run_one(engine: Engine, how: Any, prompt: list[int], n: int, res: Result, caches=None) -> None:
    tokens_before, seconds_before = res.decode_tokens, res.decode_s
    if isinstance(how, DecodeSettings):
        tokens, stats = engine.decode(prompt, how, caches=caches)
        res.ttft.append(stats.ttft_s)
        res.decode_tokens += max(stats.new_tokens - 1, 0)  # the first token comes alone, from the prefill
        res.decode_s += (stats.token_times[-1] - stats.token_times[0]) if stats.token_times else 0.0
        res.drafted += stats.drafted
        res.accepted += stats.accepted
        res.rejections += sum(1 for d, a in zip(stats.draft_lengths, stats.accepted_lengths, strict=False) if a < d)
        res.verify_calls += max(stats.target_calls - 1, 0)
        res.verify_tokens += max(stats.new_tokens - 1, 0)
        res.draft_lengths.update(stats.draft_lengths)
    else:
        if isinstance(how, LlamaCppAlone):
            tokens, ttft, decode_s, decode_tokens = how.run(prompt, n, engine.stop_ids)
        else:
            tokens, ttft, decode_s, decode_tokens = hf_generate(engine.target_model, prompt, n, engine.stop_ids, **how)
        res.ttft.append(ttft)
        res.decode_tokens += decode_tokens
        res.decode_s += decode_s
        res.verify_calls += decode_tokens  # one target pass per token
        res.verify_tokens += decode_tokens
    res.tokens.append(tokens)
    res.run_rates.append((res.decode_tokens - tokens_before) / max(res.decode_s - seconds_before, 1e-9))
    res.peak_rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    res.rss_gib = max(res.rss_gib, _rss_gib())


def main(argv: list[str], *, target: str, draft: str | None, settings: dict[str, Any]) -> int:
    args = _parser(settings).parse_args(argv)
    if args.quality:
        from llm import quality

        return quality.run(target, args.out or "bench-results/llm-quality.json", args.max_new_tokens)
    if args.conversation:
        from llm import bench_soak

        return bench_soak.run(
            args.conversation,
            target=target,
            draft=draft,
            settings=settings,
            out=args.out or "bench-results/llm-soak.json",
            max_new_tokens=args.soak_max_new_tokens,
            history_tokens=args.history_tokens,
            trim_to=args.trim_to,
            warm=not args.no_warm,
        )
    load_before = list(os.getloadavg())
    started = time.time()
    load = LoadSettings.from_config(settings)
    settings = {**settings, "mode": load.mode if draft else "ngram"}
    engine = load_engine(target, draft, settings, keep_draft=True)  # the fixed-k draft methods run too
    calibration = engine.info.get("calibration")
    if calibration:
        print(f"calibration on this device: {json.dumps(calibration)}")
    if "huge_pages_mb" in engine.info:  # llama.cpp: its own loop below keeps the small pages it loads into
        print(f"our engine's target weights in huge pages: {engine.info['huge_pages_mb']} MB (llm.huge_pages)")
    hf_draft = None
    if draft and not args.no_hf and load.engine_kind != "llama.cpp":
        hf_draft, _ = load_causal_lm(draft, device=load.device, dtype=load.dtype)
    conv = engine.conversation(SYSTEM)
    prompts = [conv.prompt_ids(conv.messages + [{"role": "user", "content": text}]) for text in PROMPTS[: args.prompts]]
    methods = _methods(args, engine, hf_draft, settings)
    results = {name: Result(name) for name, _ in methods}
    engine.decode(prompts[0], DecodeSettings(mode="target", max_new_tokens=4))  # first-call overheads, off the clock
    with tqdm(total=args.rounds * len(prompts) * len(methods), desc="bench llm", unit="run", disable=None) as bar:
        for rnd in range(args.rounds):
            for i, prompt in enumerate(prompts):
                # a fresh seeded order per prompt: a rotation keeps each method behind the same neighbour, so
                # whatever one run leaves behind (a warm cache, a busy core) would always favour the same method
                order = random.Random(rnd * len(prompts) + i).sample(methods, len(methods))
                for name, how in order:
                    bar.set_postfix_str(f"round {rnd + 1}, prompt {i + 1}: {name}")
                    _run_one(engine, how, prompt, args.max_new_tokens, results[name])
                    bar.update(1)
    reference = results[BASE].tokens
    for res in results.values():
        res.identical = [a == b for a, b in zip(res.tokens, reference, strict=False)]
    base = results[BASE].decode_tokens_per_s
    hf = [r for r in results.values() if r.name.startswith("transformers assisted")]
    best_hf = max(hf, key=lambda r: r.decode_tokens_per_s) if hf else None
    rows = [r.row(base, best_hf.decode_tokens_per_s if best_hf else None) for r in results.values()]
    _print_table(rows)
    summary = _summary(rows, best_hf.name if best_hf else None)
    summary.update(_default_summary(rows, calibration))
    head = _head_coverage(engine, reference)
    if head:
        summary["draft_head"] = head
        print(
            f"draft head: {head['rows']} rows ({head['chosen_by']}), covers {100 * head['coverage']:.1f}% "
            "of the target-alone reply tokens"
        )
    divergences = _divergences(engine, prompts, results)
    for d in divergences:
        print(
            f"diverged: {d['method']}, prompt {d['prompt'] + 1}, token {d['position']}: target top-2 logit gap "
            f"{d['top2_gap']:.4f}"
        )
    turns = asyncio.run(_two_turns(engine))
    print(
        f"conversation: turn 1 ttft {turns[0]['ttft_ms']:.0f} ms (prefill {turns[0]['prefill_tokens']} tokens), "
        f"turn 2 ttft {turns[1]['ttft_ms']:.0f} ms (prefill {turns[1]['prefill_tokens']} of "
        f"{turns[1]['prompt_tokens']} tokens)"
    )
    out = {
        "results": rows,
        "summary": summary,
        "divergences": divergences,
        "conversation_turns": turns,
        "meta": {
            "target": target,
            "draft": draft,
            "settings": settings,
            "engine": engine.info,
            "max_new_tokens": args.max_new_tokens,
            "rounds": args.rounds,
            "prompts": PROMPTS[: args.prompts],
            "torch_threads": torch.get_num_threads(),
            "load_average_before": load_before,
            "load_average_after": list(os.getloadavg()),
            "wall_s": round(time.time() - started, 1),
            "policy": _policy_state(engine),
        },
        "tokens": {r.name: r.tokens for r in results.values()},
        "text": {
            r.name: [engine.tokenizer.decode(t, skip_special_tokens=True) for t in r.tokens] for r in results.values()
        },
    }
    path = Path(args.out or "bench-results/llm.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    return 0


def _summary(rows: list[dict[str, Any]], best_hf: str | None) -> dict[str, Any]:
    ours = [r for r in rows if r["method"].startswith("ours draft")]
    if not ours:
        return {}
    best = max(ours, key=lambda r: r["decode_tokens_per_s"])
    summary = {
        "best_ours": best["method"],
        "best_ours_speedup": best["speedup"],
        "best_transformers_assisted": best_hf,
        "ours_vs_best_assisted": best["vs_best_assisted"],
    }
    line = f"\nbest ours: {best['method']} {best['speedup']:.2f}x decode-phase vs the target alone"
    if best_hf:
        line += f"; {best['vs_best_assisted']:.2f}x vs best transformers assisted ({best_hf})"
    print(line)
    return summary


def _default_summary(rows: list[dict[str, Any]], calibration: dict[str, Any] | None) -> dict[str, Any]:
    """``ours default`` against the target alone (same engine) and llama.cpp's own loop, and what it drafted."""
    by = {r["method"]: r for r in rows}
    default = by.get(DEFAULT)
    if default is None:
        return {}
    out: dict[str, Any] = {"default_draft_lengths": default["draft_lengths"]}
    line = f"ours default: {default['decode_tokens_per_s']:.2f} tok/s"
    for name, key in ((BASE, "default_vs_target_alone"), (LLAMA_CPP_ALONE, "default_vs_llama_cpp_alone")):
        if name in by and by[name]["decode_tokens_per_s"]:
            out[key] = round(default["decode_tokens_per_s"] / by[name]["decode_tokens_per_s"], 3)
            out[key.replace("vs", "ttft_vs")] = round(default["ttft_ms"] / by[name]["ttft_ms"], 3)
            line += f", {out[key]:.2f}x {name} (ttft {default['ttft_ms']:.0f} vs {by[name]['ttft_ms']:.0f} ms)"
    if calibration:
        out["drafter"] = calibration.get("drafter")
        line += f"; drafter: {calibration.get('drafter')}, k drafted per step: {default['draft_lengths'] or '-'}"
    print(line)
    return out


def _head_coverage(engine: Engine, replies: list[list[int]]) -> dict[str, Any] | None:
    head = engine.info.get("draft_head")
    if engine.draft_out_ids is None or not head:
        return None
    return {**head, "coverage": round(coverage(engine.draft_out_ids, replies), 4)}


def _divergences(engine: Engine, prompts: list[list[int]], results: dict[str, Result]) -> list[dict[str, Any]]:
    """Where a method's output first differs from the target alone, and how close the target's top two logits
    were there (one target pass over the common prefix)."""
    out = []
    reference = results[BASE].tokens
    for name, res in results.items():
        for i, tokens in enumerate(res.tokens):
            ref = reference[i]
            pos = next((j for j, (a, b) in enumerate(zip(ref, tokens, strict=False)) if a != b), None)
            if pos is None:
                continue
            with engine.lock:
                logits = engine.new_caches()[0].logits(prompts[i % len(prompts)] + ref[:pos])[-1]
            top = torch.topk(logits, 2).values
            out.append(
                {
                    "method": name,
                    "prompt": i % len(prompts),
                    "position": pos,
                    "top2_gap": round(float(top[0] - top[1]), 4),
                    "target_token": ref[pos],
                    "method_token": tokens[pos],
                }
            )
    return out


async def _two_turns(engine: Engine) -> list[dict[str, Any]]:
    """Time to first token of a first and a second turn of one conversation (the second reuses the caches)."""
    conv = engine.conversation(SYSTEM)
    turns = []
    for text in ("What's a good name for a cat?", "And one for a dog?"):
        async for _ in conv.reply(text, engine.settings.but(max_new_tokens=12)):
            pass
        st = conv.last_stats
        assert st is not None
        turns.append(
            {
                "ttft_ms": round(st.ttft_s * 1000, 1),
                "prefill_tokens": st.prefill_tokens,
                "prompt_tokens": st.prompt_tokens,
            }
        )
    return turns


def _policy_state(engine: Engine) -> dict[str, Any]:
    policy = engine.policy_for(engine.settings.but(mode="draft"))
    return {
        "alpha": round(policy.alpha, 3),
        "kappa": round(policy.kappa, 3),
        "sibling_beta": round(policy.beta, 3),
        "draft_step_s": policy.draft_s,
        "verify_s": {str(k): round(v, 4) for k, v in sorted(policy.verify_s.items())},
    }


def _print_table(rows: list[dict[str, Any]]) -> None:
    cols = [
        ("method", 38, "method"),
        ("decode_tokens_per_s", 8, "tok/s"),
        ("speedup", 8, "speedup"),
        ("vs_best_assisted", 8, "vs HF"),
        ("alpha", 6, "alpha"),
        ("mean_accepted_length", 8, "mean acc"),
        ("ttft_ms", 8, "ttft ms"),
        ("rss_gib", 7, "RSS GiB"),
        ("identical", 17, "identical"),
    ]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (_, w, h) in enumerate(cols)))
    for r in rows:
        cells = []
        for i, (key, width, _) in enumerate(cols):
            v = r[key]
            text = "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
            cells.append(text.ljust(width) if i == 0 else text.rjust(width))
        print("  ".join(cells))
