"""`specvoice serve` as a process: refuses an exposed bind without a token, tells systemd when it is ready,
and on SIGTERM lets the turn in progress finish, closes clients with 1001 and exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed

from broker import free_port
from serving import sdk

ROOT = Path(__file__).resolve().parent.parent
SPECVOICE = [sys.executable, "-m", "voice.app.cli"]


@pytest.mark.parametrize(
    "setting, fix", [("server.host=0.0.0.0", "server.token"), ("wyoming.host=0.0.0.0", "wyoming.allowed_clients")]
)
def test_exposed_bind_without_token_or_allow_list_is_refused(setting, fix):
    """Refused before any model is loaded, with the key to set."""
    result = subprocess.run(
        [*SPECVOICE, "-c", "configs/small.toml", "--set", setting, "serve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert fix in result.stderr and "0.0.0.0" in result.stderr


async def test_sigterm_finishes_the_turn_then_exits_cleanly():
    port, wyoming_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        notify_path = os.path.join(tmp, "notify")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        notify.setblocking(False)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "NOTIFY_SOCKET": notify_path}
        proc = await asyncio.create_subprocess_exec(
            *SPECVOICE,
            "-c",
            "configs/small.toml",
            "--set",
            f"server.port={port}",
            "--set",
            f"wyoming.port={wyoming_port}",
            "--set",
            "server.shutdown_grace_s=60",
            "serve",
            cwd=ROOT,
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(120):
                while b"specvoice serve:" not in (line := await proc.stderr.readline()):
                    assert line, "the server exited before it was ready"
            drain = asyncio.create_task(proc.stderr.read())  # keep the pipe from filling up
            loop = asyncio.get_running_loop()
            states = [(await loop.sock_recv(notify, 4096)).decode() for _ in range(3)]
            assert states[:2] == ["STATUS=loading models", "READY=1"] and states[2].startswith("STATUS=serving")

            url = f"ws://127.0.0.1:{port}/v1"
            async with sdk(url).realtime.connect(model="smollm2") as conn:
                assert json.loads(await conn.recv_bytes())["type"] == "session.created"
                await conn.conversation.item.create(
                    item={
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Tell me about the moon."}],
                    }
                )
                await conn.response.create(response={"output_modalities": ["text"]})
                kinds = []
                while (kind := json.loads(await conn.recv_bytes())["type"]) != "response.output_text.delta":
                    kinds.append(kind)
                proc.send_signal(signal.SIGTERM)  # mid-reply
                done = None
                with pytest.raises(ConnectionClosed) as closed:
                    async with asyncio.timeout(120):
                        while True:
                            event = json.loads(await conn.recv_bytes())
                            if event["type"] == "response.done":
                                done = event
                assert done is not None and done["response"]["status"] == "completed"
                assert closed.value.rcvd.code == 1001
            assert await asyncio.wait_for(proc.wait(), 60) == 0, (await drain).decode()[-2000:]
            assert (await loop.sock_recv(notify, 4096)).decode() == "STOPPING=1"
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            notify.close()
