"""The `specvoice` command as a user meets it, run as a real subprocess: --version, every --help, a closed
pipe, and bad input (node_id, config file, credential) as one clear line with exit 2 (which the systemd units
do not restart)."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from voice.app.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
HELP_COMMANDS = [
    "",
    "config",
    "config show",
    "config check",
    "models",
    "models list",
    "models prepare",
    "models verify",
    *sorted({key.split()[0] for key in COMMANDS} - {"bench"}),
    "bench",
    *sorted(key for key in COMMANDS if key.startswith("bench ")),
]


def specvoice(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("SPECVOICE_")}
    environ.update({"PYTHONPATH": str(ROOT), **(env or {})})
    kwargs.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(
        [sys.executable, "-m", "voice.app.cli", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
        timeout=120,
        cwd="/",
        **kwargs,
    )


def one_clear_line(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("specvoice: ") and "fix:" in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]


def test_version_is_the_package_version():
    result = specvoice("--version")
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.returncode == 0 and result.stdout.strip() == f"specvoice {expected}"


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=lambda c: c or "top")
def test_every_help_exits_0_with_usage_on_stdout(command):
    result = specvoice(*command.split(), "--help")
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower() and result.stderr == ""


@pytest.mark.parametrize(
    "args, named",
    [
        (("bench", "soak", "--passes", "0"), "--passes: 0 is below 1"),
        (("bench", "soak", "--gap-s", "-2"), "--gap-s: -2 is below 0"),
        (("bench", "soak", "--turns", "ten"), "--turns: 'ten' is not an integer"),
        (("bench", "pipeline", "--questions", "-1"), "--questions: -1 is below 1"),
        (("bench", "frontend", "--tokens-per-s", "x"), "--tokens-per-s: 'x' is not a number"),
        (("bench", "backchannel", "--echo-gain", "-1"), "--echo-gain: -1 is below 0"),
        (("bench", "backchannel", "--after", "soon"), "--after: 'soon' is not a number"),
        (("bench", "home", "--format", "json"), "--format: invalid choice"),
        (("bench", "soak", "--spoken", "-3"), "--spoken: -3 is below 0"),
        (("bench", "faults", "--only", "engine,meteor"), "unknown faults ['meteor']; fix: choose from"),
    ],
)
def test_a_nonsense_bench_number_is_a_usage_error_naming_the_flag(args, named):
    """Refused before anything loads: a negative count once ran a benchmark for minutes that reported nothing."""
    result = specvoice("-c", "small", *args)
    assert result.returncode == 2 and named in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_every_subcommand_is_in_the_help_list():
    assert {key.split()[0] for key in COMMANDS} | {"config", "models"} <= {c.split()[0] for c in HELP_COMMANDS if c}


def test_closed_pipe_is_quiet():
    """The reader is gone before the first write: `specvoice config show | head -1` with an early head."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = specvoice("-c", "small", "config", "show", stdout=write)
    finally:
        os.close(write)
    assert result.returncode == 0 and result.stderr == ""


def test_closed_pipe_through_a_shell():
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        f"{sys.executable} -m voice.app.cli config show | head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        cwd="/",
    )
    assert result.stdout.strip() == "[models]" and result.stderr == ""


@pytest.mark.parametrize(
    "how", [["--set", "mqtt.node_id=kitchen speaker"], ["--set", "mqtt.node_id=a/b"]], ids=["space", "slash"]
)
def test_bad_node_id_is_one_line_and_exit_2(how):
    one_clear_line(specvoice(*how, "config", "show"), "mqtt.node_id")


def test_bad_node_id_from_the_environment_stops_serve_before_any_model_loads():
    one_clear_line(specvoice("-c", "small", "serve", env={"SPECVOICE_MQTT__NODE_ID": "x.y"}), "node id")


def test_missing_config_file_is_one_line_and_exit_2(tmp_path):
    one_clear_line(specvoice("-c", str(tmp_path / "nope.toml"), "config", "show"), "nope.toml", "does not exist")
    one_clear_line(specvoice("serve", env={"SPECVOICE_CONFIG": str(tmp_path / "gone.toml")}), "gone.toml")


@pytest.mark.parametrize("kind", ["directory", "not-utf8", "missing-folder"])
def test_unreadable_credential_is_one_line_and_exit_2(tmp_path, kind):
    folder = tmp_path / "credentials"
    if kind != "missing-folder":
        folder.mkdir()
        target = folder / "specvoice_mqtt.password"
        if kind == "directory":
            target.mkdir()
        else:
            target.write_bytes(b"\xff\xfe hunter2")
    result = specvoice("-c", "small", "serve", env={"CREDENTIALS_DIRECTORY": str(folder)})
    one_clear_line(result, "credential", "LoadCredential=")
    assert "hunter2" not in result.stderr


def test_config_show_hides_a_credential_secret(tmp_path):
    (tmp_path / "specvoice_mqtt.password").write_text("hunter2\n")
    result = specvoice("-c", "small", "config", "show", env={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert result.returncode == 0 and "hunter2" not in result.stdout and "password" in result.stdout
    shown = specvoice("-c", "small", "config", "show", "--secrets", env={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert 'password = "hunter2"' in shown.stdout


@pytest.mark.parametrize(
    "args, named",
    [
        (("--prompt", "eager"), "--prompt: invalid choice"),
        (("--threads", "0"), "--threads: 0 is below 1"),
    ],
)
def test_stt_accuracy_refuses_a_bad_flag_naming_it(args, named):
    """The STT and end-of-turn benchmark's flags, refused before any model loads."""
    result = subprocess.run(
        [sys.executable, "-m", "voice.bench.stt_accuracy", *args], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 2 and named in result.stderr and "Traceback" not in result.stderr, result.stderr
