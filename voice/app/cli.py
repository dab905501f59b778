"""The ``specvoice`` command. Each subcommand lives in the module that does the work; this file only parses
flags, loads the config and dispatches, so ``specvoice --help`` stays fast (heavy imports happen late)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from voice.config import ConfigError, config_to_toml, load_config
from voice.logs import setup_logging, writes_to_journal

# subcommand -> "module:function"; each function is f(config, args, extra_argv) -> exit code
COMMANDS = {
    "demo": "voice.app.demo:main",
    "run": "voice.app.desktop:main",
    "transcribe": "voice.app.speech:transcribe_main",
    "say": "voice.app.speech:say_main",
    "serve": "voice.app.serve:main",
    "bench llm": "voice.app.cli:bench_llm",
    "bench speech": "voice.bench.speech:main",
    "bench pipeline": "voice.bench.pipeline:main",
    "bench soak": "voice.bench.soak:main",
    "bench frontend": "voice.bench.frontend:main",
    "bench home": "voice.bench.home:main",
    "bench backchannel": "voice.bench.backchannel:main",
    "bench rooms": "voice.bench.room_hearing:main",
    "bench wake": "voice.bench.wake:main",
    "bench faults": "voice.bench.faults:main",
}
BENCHES = [name.removeprefix("bench ") for name in COMMANDS if name.startswith("bench ")]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specvoice", description="Local real-time voice assistant with a speculative LLM core."
    )
    p.add_argument("--version", action="version", version=f"specvoice {version()}")
    p.add_argument("-c", "--config", help="TOML config (default: $SPECVOICE_CONFIG or configs/default.toml)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v info logs, -vv debug logs")
    sub = p.add_subparsers(dest="command", required=True)

    cfg = sub.add_parser("config", help="show or check configuration").add_subparsers(dest="action", required=True)
    show = cfg.add_parser("show", help="print the effective config (secrets hidden)")
    show.add_argument("--secrets", action="store_true", help="print server.token and mqtt.password too")
    check = cfg.add_parser("check", help="validate a config file")
    check.add_argument("file")

    models = sub.add_parser("models", help="list, prepare and verify models").add_subparsers(
        dest="action", required=True
    )
    models.add_parser("list", help="registered models and their state")
    prep = models.add_parser("prepare", help="build caches (default: the models the config uses)")
    prep.add_argument("names", nargs="*")
    prep.add_argument("--all", action="store_true", help="every registered model")
    prep.add_argument("--force", action="store_true", help="rebuild even when healthy")
    ver = models.add_parser("verify", help="check every installed model's files and checksums")
    ver.add_argument("--repair", action="store_true", help="rebuild damaged cache entries")

    demo = sub.add_parser("demo", help="spoken turns from WAV files, with the latency table")
    demo.add_argument(
        "--in", dest="inputs", action="append", default=[], metavar="WAV", help="question WAV (repeatable)"
    )
    demo.add_argument("--out", metavar="WAV", help="write the spoken answer(s) here")
    demo.add_argument("--json", metavar="FILE", help="write the traces as JSON")
    run = sub.add_parser("run", help="home device: microphone, speaker, wake word, MQTT bridge (when mqtt.enabled)")
    run.add_argument("--serve", action="store_true", help="also serve the websocket API and Wyoming")
    tr = sub.add_parser("transcribe", help="transcribe a WAV file, streaming partials")
    tr.add_argument("file")
    say = sub.add_parser("say", help="speak text with piper")
    say.add_argument("text")
    say.add_argument("-o", "--out", help="write a WAV instead of playing")
    sub.add_parser("serve", help="websocket + Wyoming (+ MQTT) server")
    bench = sub.add_parser(
        "bench", help="benchmarks: print a table, write JSON (`bench llm --help`: its flags)", add_help=False
    )  # --help goes on to the benchmark's own parser
    bench.add_argument(
        "what",
        nargs="?",
        choices=BENCHES,
    )
    return p


def fail(problem: object) -> None:
    """One line on stderr for bad input (the caller exits 2); an error-priority entry under journald."""
    print(f"{'<3>' if writes_to_journal(sys.stderr) else ''}specvoice: {problem}", file=sys.stderr, flush=True)


def version() -> str:
    """The installed package's version (what `--version`, /health and Home Assistant's sw_version show)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("specvoice")
    except PackageNotFoundError:
        return "0+unknown"


def bench_llm(config, args, extra: list[str]) -> int:
    """Resolve the configured pair, then hand over to llm.bench (which must not import voice)."""
    from llm import bench
    from voice.models import resolve

    if {"-h", "--help"} & set(extra):  # the flags only: no model is resolved (or built) for help
        return bench.main(extra, target="", draft=None, settings=config.llm.model_dump())
    m, engine = config.models, config.llm.engine
    target = resolve(m.target, "llm", m.cache_dir, engine=engine).location
    draft = resolve(m.draft, "llm", m.cache_dir, engine=engine).location if m.draft else None
    return bench.main(extra, target=target, draft=draft, settings=config.llm.model_dump())


def _models(config, args) -> int:
    from voice import models as m

    if args.action == "list":
        print(f"{'name':30s} {'kind':5s} {'MB':>5s}  state  (cache: {m.cache_root(config.models.cache_dir)})")
        for name, entry in m.REGISTRY.items():
            print(f"{name:30s} {entry.kind:5s} {entry.size_mb:5d}  {m.status(name, config.models.cache_dir)}")
        return 0
    used = [
        n
        for n in (
            config.models.target,
            config.models.draft if config.llm.mode == "draft" else None,
            config.models.stt,
            config.models.tts,
            config.models.vad,
            config.models.wake_word,
            config.models.turn if config.turn.engine == "smart" else None,
        )
        if n
    ]
    # the cache entries the config loads: a registered LLM in the form its engine runs (GGUF for llama.cpp)
    used = [m.for_engine(m.REGISTRY[n], config.llm.engine).name if n in m.REGISTRY else n for n in used]
    if args.action == "prepare":
        names = list(m.ENTRIES) if args.all else (args.names or used)
        for name in names:
            if name not in m.ENTRIES:
                print(f"{name}: not a registered model (local paths and hub ids need no preparation)")
                continue
            entry = m.ENTRIES[name]
            if args.names and name in m.REGISTRY:  # a registered LLM named by hand: the form the engine runs
                entry = m.for_engine(entry, config.llm.engine)
            path: Path | None
            if entry.cached:  # the cheap stamp check (size + mtime); `models verify` hashes
                path = m.build_entry(entry, m.cache_root(config.models.cache_dir), force=args.force)
            else:
                path = m.resolve(name, entry.kind, config.models.cache_dir).path
            print(f"{entry.name}: ready at {path}")
        torch_extras = config.llm.engine == "torch"
        if torch_extras and (not args.names or config.models.target in names):  # draft-head counts, int4 layers
            from llm.prepare import prepare_llm

            engine = config.llm.engine
            target = m.resolve(config.models.target, "llm", config.models.cache_dir, engine=engine).location
            draft = (
                m.resolve(config.models.draft, "llm", config.models.cache_dir, engine=engine).location
                if config.models.draft
                else None
            )
            for line in prepare_llm(target, draft, config.llm.model_dump(), force=args.force):
                print(f"{config.models.target}: {line}")
        return 0
    # verify: every installed model's files, hashed; a model never prepared fails only if the config uses it
    bad = 0
    for name, entry in m.ENTRIES.items():
        state = m.status(name, config.models.cache_dir, full=True)
        if state.startswith("not installed") or (state == f"cache {m.NOT_PREPARED}" and name not in used):
            print(f"{name:30s} {'not prepared (specvoice models prepare ' + name + ')' if entry.cached else state}")
            continue
        if state != "ok" and args.repair and entry.cached:
            m.build_entry(entry, m.cache_root(config.models.cache_dir), force=True)
            state = m.status(name, config.models.cache_dir, full=True) + " (repaired)"
        bad += not state.startswith("ok")
        print(f"{name:30s} {state}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 ok, 1 a check failed (models verify), 2 bad input (config, files, devices), 130 Ctrl-C."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`specvoice config show | head`): no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "bench" and args.what is None:
        asked = bool({"-h", "--help"} & set(extra))
        print(
            f"usage: specvoice bench {{{','.join(BENCHES)}}} [flags]   (`specvoice bench llm --help`: its flags)",
            file=sys.stdout if asked else sys.stderr,
        )
        return 0 if asked else 2
    try:
        if args.command == "config" and args.action == "check":
            from voice.models import check_models

            problems = check_models(load_config(args.file))
            for problem in problems:
                print(f"specvoice: {args.file}: {problem}", file=sys.stderr)
            print(f"{args.file}: {'ok' if not problems else 'invalid'}")
            return 2 if problems else 0
        config = load_config(args.config, overrides=args.set)
    except ConfigError as exc:
        fail(exc)
        return 2
    level = ["WARNING", "INFO", "DEBUG"][min(args.verbose, 2)] if args.verbose else config.logging.level
    setup_logging(level, config.logging.format)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.command == "config":
        print(config_to_toml(config, secrets=args.secrets), flush=True)
        return 0
    key = f"bench {args.what}" if args.command == "bench" else args.command
    if extra and not key.startswith("bench "):  # each benchmark parses its own flags
        fail(f"unknown arguments {' '.join(extra)}; fix: see `specvoice {args.command} --help`")
        return 2
    from audio.devices import DeviceError
    from audio.wavfile import WavFormatError
    from voice.models import ModelError

    try:
        if args.command == "models":
            return _models(config, args)
        module, func = COMMANDS[key].split(":")
        return int(getattr(importlib.import_module(module), func)(config, args, extra) or 0)
    except (ModelError, ConfigError, WavFormatError, DeviceError) as exc:
        fail(exc)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
