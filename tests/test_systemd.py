"""The systemd units (checked by systemd-analyze itself) and sd_notify over a real datagram socket."""

import asyncio
import ipaddress
import os
import re
import shlex
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from voice import sdnotify
from voice.app.cli import COMMANDS
from voice.config import load_config

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_UNIT = ROOT / "systemd/system/specvoice.service"
USER_UNIT = ROOT / "systemd/user/specvoice.service"
ENV_EXAMPLE = ROOT / "systemd/specvoice.env.example"


def unit_settings(path: Path) -> dict[str, list[str]]:
    """key -> values, in order (systemd allows a key more than once)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def fake_executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def verify(unit: Path, *, user: bool, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = ["systemd-analyze", *(["--user"] if user else []), "verify", str(unit)]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=60)


def test_system_unit_passes_systemd_analyze_verify(tmp_path):
    exe = tmp_path / "venv/bin/specvoice"
    fake_executable(exe)
    unit = tmp_path / "specvoice.service"
    unit.write_text(SYSTEM_UNIT.read_text().replace("/opt/specvoice/bin/specvoice", str(exe)))
    result = verify(unit, user=False, env={})
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def test_system_unit_verify_catches_a_missing_binary(tmp_path):
    """The check above can fail: a unit whose ExecStart does not exist is rejected."""
    unit = tmp_path / "specvoice.service"
    unit.write_text(SYSTEM_UNIT.read_text().replace("/opt/specvoice/bin/specvoice", str(tmp_path / "nope")))
    result = verify(unit, user=False, env={})
    assert result.returncode != 0 and "is not executable" in result.stderr


def test_user_unit_passes_systemd_analyze_verify(tmp_path):
    home, runtime = tmp_path / "home", tmp_path / "run"
    runtime.mkdir(mode=0o700)
    fake_executable(home / ".local/share/specvoice/venv/bin/specvoice")
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    unit = unit_dir / "specvoice.service"
    unit.write_text(USER_UNIT.read_text())
    result = verify(unit, user=True, env={"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)})
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


SYSTEM_EXPOSURE_MAX, USER_EXPOSURE_MAX = 1.5, 3.0  # the README states the measured scores


def exposure(unit: Path, *, user: bool, env: dict[str, str]) -> float:
    """systemd's own sandbox score (0 = locked down, 10 = none), computed offline from the unit file."""
    cmd = [
        "systemd-analyze",
        *(["--user"] if user else []),
        "security",
        "--offline=true",
        "--no-pager",
        "--threshold=100",
        str(unit),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    match = re.search(r"Overall exposure level for specvoice\.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout[-2000:]
    return float(match.group(1))


def test_system_unit_exposure_is_at_most_1_5(tmp_path):
    exe = tmp_path / "specvoice"
    fake_executable(exe)
    unit = tmp_path / "specvoice.service"
    unit.write_text(SYSTEM_UNIT.read_text().replace("/opt/specvoice/bin/specvoice", str(exe)))
    assert exposure(unit, user=False, env={}) <= SYSTEM_EXPOSURE_MAX


def test_user_unit_exposure_is_at_most_3_0(tmp_path):
    home, runtime = tmp_path / "home", tmp_path / "run"
    runtime.mkdir(mode=0o700)
    fake_executable(home / ".local/share/specvoice/venv/bin/specvoice")
    (tmp_path / "units").mkdir()
    unit = tmp_path / "units/specvoice.service"
    unit.write_text(USER_UNIT.read_text())
    assert exposure(unit, user=True, env={"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}) <= USER_EXPOSURE_MAX


def test_exposure_check_can_fail(tmp_path):
    """The score above is read, not assumed: the same unit without its hardening scores far worse."""
    exe = tmp_path / "specvoice"
    fake_executable(exe)
    bare = [
        line
        for line in SYSTEM_UNIT.read_text().splitlines()
        if not line.startswith(
            (
                "Protect",
                "Private",
                "Restrict",
                "SystemCall",
                "Capability",
                "DynamicUser",
                "IPAddress",
                "NoNewPrivileges",
                "Device",
            )
        )
    ]
    unit = tmp_path / "specvoice.service"
    unit.write_text("\n".join(bare).replace("/opt/specvoice/bin/specvoice", str(exe)))
    assert exposure(unit, user=False, env={}) > 5


@pytest.mark.parametrize("path", [SYSTEM_UNIT, USER_UNIT], ids=["system", "user"])
def test_units_do_not_restart_on_bad_input_and_take_secrets_as_credentials(path):
    """Exit 2 (bad config, node_id, credential) is final; a start loop ends; secrets come through
    LoadCredential= as a directory whose files systemd names specvoice_<file> (what load_config reads)."""
    s = unit_settings(path)
    assert s["RestartPreventExitStatus"] == ["2"]
    assert int(s["StartLimitBurst"][0]) <= 5 and int(s["StartLimitIntervalSec"][0]) >= 60
    (credential,) = s["LoadCredential"]
    name, _, folder = credential.partition(":")
    assert name == "specvoice" and folder.endswith("/specvoice/credentials")
    assert s["MemoryMax"] and s["PrivateUsers"] == ["yes"] and s["ProtectProc"] == ["invisible"]
    assert s["RestrictRealtime"] == ["yes"] and s["SystemCallFilter"][0] == "@system-service"
    assert s["DeviceAllow"] == ["char-alsa rw"]  # the microphone and speaker stay reachable


def test_credentials_as_systemd_delivers_them_reach_the_config(tmp_path):
    credentials = tmp_path / "creds"
    credentials.mkdir()
    (credentials / "specvoice_mqtt.password").write_text("s3cret\n")
    (credentials / "specvoice_server.token").write_text("tok")
    (credentials / "other-program.key").write_text("not ours")
    config = load_config("small", environ={"CREDENTIALS_DIRECTORY": str(credentials)})
    assert config.mqtt.password == "s3cret" and config.server.token == "tok"


@pytest.mark.parametrize("path", [SYSTEM_UNIT, USER_UNIT], ids=["system", "user"])
def test_ip_allow_list_covers_the_default_listen_and_broker_addresses(path):
    s = unit_settings(path)
    assert s["IPAddressDeny"] == ["any"]
    allowed = " ".join(s["IPAddressAllow"]).split()
    networks = [ipaddress.ip_network(a) for a in allowed if a != "localhost"]
    if "localhost" in allowed:
        networks += [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]
    config = load_config("default", environ={})
    for host in (config.server.host, config.wyoming.host, config.mqtt.host):
        address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
        assert any(address in net for net in networks), host


def test_system_config_directory_is_readable_by_the_dynamic_user():
    s = unit_settings(SYSTEM_UNIT)
    assert s["ConfigurationDirectory"] == ["specvoice"]
    assert int(s["ConfigurationDirectoryMode"][0], 8) & 0o005 == 0o005  # root-owned: others must read it


@pytest.mark.parametrize("path", [SYSTEM_UNIT, USER_UNIT], ids=["system", "user"])
def test_units_run_serve_as_a_notify_service_with_watchdog_and_hardening(path):
    s = unit_settings(path)
    assert s["Type"] == ["notify"] and s["Restart"] == ["on-failure"]
    assert int(s["WatchdogSec"][0]) >= 10
    assert shlex.split(s["ExecStart"][0])[1:] == ["serve"] and "serve" in COMMANDS
    assert shlex.split(s["ExecStartPre"][0])[1:] == ["models", "prepare"]
    for key, value in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("StateDirectory", "specvoice"),
        ("CacheDirectory", "specvoice"),
    ]:
        assert s[key] == [value], key
    assert s["ProtectHome"][0] in ("yes", "read-only")
    families = s["RestrictAddressFamilies"][0].split()
    assert set(families) <= {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    env = " ".join(s["Environment"])
    assert "SPECVOICE_CACHE=%C/specvoice" in env and "HF_HUB_OFFLINE=1" in env


def test_system_unit_runs_as_a_dynamic_user_in_the_audio_group():
    s = unit_settings(SYSTEM_UNIT)
    assert s["DynamicUser"] == ["yes"] and s["SupplementaryGroups"] == ["audio"]
    assert s["ProtectHome"] == ["yes"] and "PrivateDevices" not in s  # PrivateDevices would hide /dev/snd
    assert s["DeviceAllow"] == ["char-alsa rw"]


def env_file_assignments(path: Path, *, include_commented: bool) -> dict[str, str]:
    """KEY=value lines as systemd reads them (shell-like quoting); commented examples too if asked."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if include_commented and line.startswith("#SPECVOICE_"):
            line = line[1:]
        if line.startswith("SPECVOICE_"):
            key, _, value = line.partition("=")
            out[key] = shlex.split(value)[0] if value else ""
    return out


def test_environment_example_is_a_valid_config(tmp_path):
    toml = tmp_path / "specvoice.toml"
    toml.write_text('[models]\ntarget = "smollm2-135m-instruct"\n[llm]\nmode = "ngram"\n')
    for commented in (False, True):
        env = env_file_assignments(ENV_EXAMPLE, include_commented=commented)
        env["SPECVOICE_CONFIG"] = str(toml)
        config = load_config(None, environ=env)
        assert config.mqtt.enabled and config.logging.level == "INFO"
    assert config.mqtt.allowed_actions == {"home/kitchen/light/set": ["ON", "OFF"]}
    assert config.mqtt.tls and config.mqtt.password == "change-me"


# ---- sd_notify ---------------------------------------------------------------------------------------------


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    for name in ("WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    yield sock
    sock.close()


def test_notify_sends_the_state_to_the_socket(notify_socket):
    assert sdnotify.notify("READY=1\nSTATUS=serving")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=serving"


def test_notify_reaches_an_abstract_socket(monkeypatch):
    name = f"specvoice-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify("READY=1")
        assert sock.recv(64) == b"READY=1"


def test_notify_is_a_no_op_outside_systemd(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False


def test_notify_to_a_dead_socket_returns_false_without_raising(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert sdnotify.notify("READY=1") is False


async def test_watchdog_pings_at_half_the_interval(notify_socket, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == pytest.approx(0.1)
    notify_socket.setblocking(False)
    task = asyncio.create_task(sdnotify.watchdog())
    loop = asyncio.get_running_loop()
    pings = [await asyncio.wait_for(loop.sock_recv(notify_socket, 64), 5) for _ in range(3)]
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert pings == [b"WATCHDOG=1"] * 3


@pytest.mark.parametrize(
    "env",
    [{}, {"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"}, {"WATCHDOG_USEC": "soon"}, {"WATCHDOG_USEC": "0"}],
    ids=["unset", "other-pid", "malformed", "zero"],
)
async def test_watchdog_returns_at_once_when_not_asked_for(notify_socket, monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    await asyncio.wait_for(sdnotify.watchdog(), 1)
    notify_socket.settimeout(0.05)
    with pytest.raises(TimeoutError):
        notify_socket.recv(64)
