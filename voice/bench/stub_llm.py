"""A stand-in for a GPU LLM server, for ``specvoice bench frontend`` only: OpenAI chat completions that stream
a canned spoken-style reply after a set first-token delay at a set token rate, and cost this machine almost
nothing. With it, a front-end's own capacity (VAD, Whisper, piper, websockets) is measured without an LLM's
compute on the same two cores; the delay and the rate are the GPU's part, stated with every figure.

It also notes when each streaming request's client connection closed before the reply was over (a cancel), on
CLOCK_MONOTONIC, so the benchmark can time barge-in -> request closed as the server sees it. Minimal HTTP/1.1
(keep-alive, chunked SSE): enough for the openai SDK; not a server for anything else.

The reply streams a word a chunk, each word timed as ``TOKENS_PER_WORD`` tokens, so ``tokens_per_s`` is a rate in
tokens as a GPU server's is (a BPE vocabulary of 32k-150k spends ~1.3 tokens on an English word; a server's
detokenizer also sends about a word a chunk).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from voice.tasks import cancel_and_wait, start

TOKENS_PER_WORD = 1.3
REPLY = (
    "Paris is the capital of France, and it sits on the river Seine. Spring and early autumn are the best "
    "times to visit, when the weather is mild and the crowds are smaller."
)


class StubLLM:
    def __init__(self, ttft_s: float = 0.2, tokens_per_s: float = 40.0, reply: str = REPLY) -> None:
        self.ttft_s, self.tokens_per_s = ttft_s, tokens_per_s
        self.words = re.findall(r"\s*\S+", reply)
        self.cycle = False  # True: the reply repeats up to the request's max_tokens
        self.closed: list[float] = []  # when a client went away mid-reply
        self.requests = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> StubLLM:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return self

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                path = head[0].split(" ")[1]
                fields = dict(line.split(":", 1) for line in head[1:] if ":" in line)
                length = int(next((v for k, v in fields.items() if k.lower() == "content-length"), "0"))
                body = json.loads(await reader.readexactly(length)) if length else {}
                if path.endswith("/chat/completions"):
                    if not await self._stream(reader, writer, body):
                        return
                elif path.endswith("/models"):
                    self._reply(writer, 200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
                else:
                    self._reply(writer, 404, {"error": {"message": f"no {path} here"}})
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _reply(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        writer.write(
            b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(data), data)
        )

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict) -> bool:
        """Stream the reply; False when the client closed the connection first (noted in ``closed``)."""
        self.requests += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        gone = start(reader.read(1))  # the client sends nothing more until the reply is over
        try:
            wanted = max(1, int(int(body.get("max_tokens") or 10**6) / TOKENS_PER_WORD))  # in words
            words = (self.words * (wanted // len(self.words) + 1) if self.cycle else self.words)[:wanted]
            for i, word in enumerate(words):
                await asyncio.wait({gone}, timeout=self.ttft_s if i == 0 else TOKENS_PER_WORD / self.tokens_per_s)
                if gone.done():
                    self.closed.append(time.monotonic())
                    return False
                self._event(writer, {"choices": [{"index": 0, "delta": {"content": word}}]})
                await writer.drain()
            used = round(len(words) * TOKENS_PER_WORD)
            self._event(
                writer,
                {
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 0, "completion_tokens": used, "total_tokens": used},
                },
            )
            writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
            return True
        except ConnectionError:
            self.closed.append(time.monotonic())
            return False
        finally:
            await cancel_and_wait(gone)

    @staticmethod
    def _event(writer: asyncio.StreamWriter, chunk: dict[str, Any]) -> None:
        data = b"data: " + json.dumps({"object": "chat.completion.chunk", "model": "stub", **chunk}).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
