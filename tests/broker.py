"""A real mosquitto broker for tests: a temp config on a free loopback port, with persistence, so tests can
stop and restart it and the persistent sessions (queued QoS 1 messages) survive, as on a real server.

Optional: password authentication and a TLS listener (a throwaway CA and server certificate made with the
openssl command line).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import random
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiomqtt

MOSQUITTO = "/usr/sbin/mosquitto"


# Ports a test server listens on come from below Linux's ephemeral range (32768 and up by default). A port the
# kernel hands out for "port 0" is also what any process's next outgoing connection may take as its own source
# port, between the check and the server's bind: a CI run lost a Wyoming test to exactly that.
SERVER_PORTS = range(20000, 32768)
_handed_out: set[int] = set()
_ports = random.Random()


def free_port() -> int:
    """A loopback port no one listens on now, never handed out before in this run."""
    for _ in range(1000):
        port = _ports.choice(SERVER_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {SERVER_PORTS}")


@dataclass
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def make_tls_files(folder: Path, host: str = "127.0.0.1") -> TlsFiles:
    """A CA and a server certificate for ``host`` (as an IP SAN), valid for a day."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = folder / "san.ext"
    ext.write_text(f"subjectAltName=IP:{host}\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    run(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=specvoice test CA",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
    )
    run(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        f"/CN={host}",
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        str(ext),
        "-out",
        str(cert),
    )
    return TlsFiles(ca, cert, key)


class Broker:
    """One mosquitto process. ``start``/``stop``/``restart`` keep the port and the persistence file."""

    host = "127.0.0.1"

    def __init__(
        self,
        workdir: Path,
        *,
        users: dict[str, str] | None = None,
        tls: TlsFiles | None = None,
        max_packet_size: int | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_file = self.workdir / "mosquitto.log"
        self.proc: subprocess.Popen | None = None
        lines = [
            f"listener {self.port} {self.host}",
            f"persistence true\npersistence_location {self.workdir}/\nautosave_interval 1",
            f"log_dest file {self.log_file}\nlog_type error\nlog_type warning\nlog_type notice\nlog_type information",
            "connection_messages true",
            f"user {getpass.getuser()}",  # as root, mosquitto would switch to the mosquitto user and lose the files
        ]
        if users:
            passwd = self.workdir / "passwd"
            passwd.write_text("")
            for name, password in users.items():
                subprocess.run(
                    ["mosquitto_passwd", "-b", str(passwd), name, password], check=True, capture_output=True, timeout=30
                )
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        else:
            lines.append("allow_anonymous true")
        if tls:
            lines += [f"cafile {tls.ca}", f"certfile {tls.cert}", f"keyfile {tls.key}"]
        if max_packet_size:  # a bigger packet from a client makes the broker drop its connection
            lines.append(f"max_packet_size {max_packet_size}")
        self.config = self.workdir / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("broker already running")
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mosquitto exited ({self.proc.returncode}): {self.proc.stderr.read().decode()} {self.log()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout}s: {self.log()}")

    def stop(self) -> None:
        """SIGTERM: mosquitto writes its persistence file (sessions, queued messages, retained) and exits."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc.stderr.close()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Home:
    """The other side of the bridge, as a home automation system sees it: an aiomqtt client that records every
    message under the topics it follows and lets a test wait for one. Persistent session (fixed id,
    clean_session False), so it can also ride out a broker restart with ``reconnect``."""

    def __init__(self, broker: Broker, topics: tuple[str, ...] = ("#",), *, identifier: str = "home", **client):
        self.broker = broker
        self.topics = topics
        self.identifier = identifier
        self.client_kwargs = client
        self.messages: list = []  # aiomqtt.Message, in arrival order
        self._arrived = None
        self._client = None
        self._reader = None

    async def connect(self) -> Home:
        self._arrived = asyncio.Event()
        self._client = aiomqtt.Client(
            self.broker.host, self.broker.port, identifier=self.identifier, clean_session=False, **self.client_kwargs
        )
        await self._client.__aenter__()
        await self._client.subscribe([(t, 1) for t in self.topics])
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for message in self._client.messages:
            self.messages.append(message)
            self._arrived.set()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._client is not None:
            with contextlib.suppress(aiomqtt.MqttError):
                await self._client.__aexit__(None, None, None)
        self._client = self._reader = None

    async def reconnect(self, timeout: float = 10.0) -> None:
        """After a broker restart: connect again with the same session."""
        await self.close()
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await self.connect()
                    return
                except aiomqtt.MqttError:
                    await asyncio.sleep(0.1)

    async def publish(self, topic: str, payload, *, retain: bool = False) -> None:
        await self._client.publish(topic, payload, qos=1, retain=retain)

    def received(self, topic: str, since: int = 0, *, live: bool = False) -> list:
        """Messages on ``topic`` from index ``since``; ``live``: only those published while we listened, not
        the retained copies a subscription brings."""
        return [m for m in self.messages[since:] if m.topic.matches(topic) and not (live and m.retain)]

    def texts(self, topic: str, since: int = 0, *, live: bool = False) -> list[str]:
        return [m.payload.decode() for m in self.received(topic, since, live=live)]

    async def wait_for(self, topic: str, predicate=lambda text: True, *, since: int = 0, timeout: float = 60.0):
        """The first message on ``topic`` (wildcards allowed) at index >= ``since`` whose text satisfies
        ``predicate``; returns its decoded payload (JSON payloads decoded to objects)."""
        async with asyncio.timeout(timeout):
            seen = since
            while True:
                for message in self.messages[seen:]:
                    seen += 1
                    if not message.topic.matches(topic):
                        continue
                    text = message.payload.decode()
                    try:
                        value = json.loads(text) if text.startswith(("{", "[")) else text
                    except ValueError:
                        value = text
                    if predicate(value):
                        return value
                self._arrived.clear()
                await self._arrived.wait()

    async def wait_count(
        self, topic: str, n: int, *, since: int = 0, timeout: float = 60.0, where=lambda message: True
    ) -> list:
        """Wait until ``n`` messages on ``topic`` (and satisfying ``where``) arrived at index >= ``since``."""
        async with asyncio.timeout(timeout):
            while True:
                found = [m for m in self.received(topic, since) if where(m)]
                if len(found) >= n:
                    return found
                self._arrived.clear()
                await self._arrived.wait()

    def mark(self) -> int:
        """An index to pass as ``since``: only messages after this point."""
        return len(self.messages)

    async def __aenter__(self) -> Home:
        return await self.connect()

    async def __aexit__(self, *exc) -> None:
        await self.close()
