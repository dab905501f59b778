"""The package as a user installs it: `pip wheel .` then a non-editable install into a fresh venv, run from
another directory with no PYTHONPATH. Why: an editable install (what the other tests use) reads configs and
page files from the source tree, so a file missing from the wheel (configs/default.toml was) goes unnoticed.

The venv gets the already installed dependencies through a .pth line (offline, seconds), never this source
tree; `--no-build-isolation` builds with the installed setuptools (no download)."""

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import wave
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLEAN_ENV = {
    key: value
    for key, value in os.environ.items()
    if key != "PYTHONPATH" and not key.startswith(("SPECVOICE_", "PIP_"))
}
SKIP = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "*.egg-info",
    "__pycache__",
    "bench-results",
    "out",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh venv holding the wheel built from a copy of this tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=SKIP)
    wheels = tmp / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
        ],
        check=True,
        timeout=300,
        cwd=tmp,
        env=CLEAN_ENV,
    )
    (wheel,) = wheels.glob("specvoice-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_specvoice_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        timeout=300,
        env=CLEAN_ENV,
    )
    return venv / "bin"


def run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / "specvoice"), *args], capture_output=True, text=True, env=CLEAN_ENV, cwd=cwd, timeout=300
    )


def test_wheel_carries_the_shipped_configs_and_page(installed):
    (wheel,) = installed.parent.parent.glob("wheels/specvoice-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"voice/configs/{p.name}" for p in (ROOT / "configs").glob("*.toml")}
    assert shipped and shipped <= names
    assert {"voice/web/index.html", "voice/py.typed", "audio/py.typed"} <= names


def test_installed_package_is_imported_from_the_venv_not_the_tree(installed, tmp_path):
    result = subprocess.run(
        [str(installed / "python"), "-c", "import voice, audio, llm; print(voice.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=CLEAN_ENV,
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(installed.parent)


def test_installed_command_runs_from_another_directory(installed, tmp_path):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert run(installed, "--version", cwd=tmp_path).stdout.strip() == f"specvoice {version}"
    shown = run(installed, "config", "show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("[models]") and 'target = "qwen2.5-coder-1.5b-instruct"' in shown.stdout
    small = run(installed, "-c", "small", "config", "show", cwd=tmp_path)
    assert small.returncode == 0 and 'target = "smollm2-135m-instruct"' in small.stdout
    listed = run(installed, "models", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "whisper-tiny.en" in listed.stdout and "piper-joe-medium" in listed.stdout


def test_installed_command_speaks(installed, tmp_path):
    """A real command through the installed package: piper from the model cache into a WAV."""
    result = run(installed, "-c", "small", "say", "Hello from the wheel.", "-o", "hello.wav", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with wave.open(str(tmp_path / "hello.wav")) as wav:
        assert wav.getnframes() > wav.getframerate() * 0.5


def test_installed_demo_answers_aloud(installed, tmp_path):
    """The whole loop from the wheel: two spoken questions, transcribed, answered by the small LLM, spoken."""
    result = run(installed, "-c", "small", "demo", "--out", "answer.wav", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("assistant: ") == 2 and "voice_to_voice" in result.stdout
    with wave.open(str(tmp_path / "answer.wav")) as wav:
        assert wav.getnframes() > wav.getframerate() * 0.5
