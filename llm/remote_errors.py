"""What can go wrong with a remote LLM server, what the assistant says about it, and when to try again.

Every failure of a remote reply is one ``RemoteLLMError``: its ``kind`` (down, busy, slow, dropped, refused)
picks the sentence the turn speaks, and its message names the server and the fix for logs and clients.
"""

from __future__ import annotations

from openai import APIStatusError, InternalServerError, RateLimitError

SPOKEN = {
    "down": "Sorry, I can't reach my language server right now. Please try again in a moment.",
    "busy": "Sorry, my language server is busy right now. Please try again in a moment.",
    "slow": "Sorry, my language server is taking too long to answer. Please try again.",
    "dropped": "Sorry, I lost the connection to my language server.",
    "refused": "Sorry, my language server refused that request.",
}


class RemoteLLMError(RuntimeError):
    """The server gave no (complete) reply. ``kind``: down, busy, slow, dropped or refused; ``spoken``: what the
    assistant says about it (the Turn speaks it); the message names the server and the fix, for logs and clients."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def spoken(self) -> str:
        return SPOKEN[self.kind]


def retry_delay(exc: BaseException, attempt: int) -> float:
    """Exponential backoff from 0.2 s, or the server's Retry-After (429/503) when it says, at most 5 s."""
    delay = 0.2 * 2**attempt
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            delay = float(response.headers.get("retry-after", delay))
        except ValueError:
            pass
    return min(max(delay, 0.0), 5.0)


def unavailable(exc: BaseException, url: str, attempts: int) -> RemoteLLMError:
    if isinstance(exc, RateLimitError):
        return RemoteLLMError(
            "busy",
            f"the LLM server at {url} answered 429 (too many requests) {attempts} time(s); "
            "fix: add server capacity, or raise llm.retries",
        )
    if isinstance(exc, InternalServerError):
        return RemoteLLMError(
            "busy",
            f"the LLM server at {url} failed with HTTP {exc.status_code} {attempts} "
            f"time(s) ({exc.message}); fix: check the server's log",
        )
    return RemoteLLMError(
        "down",
        f"cannot reach the LLM server at {url} ({type(exc).__name__}: {exc}) after "
        f"{attempts} attempt(s); fix: start the server, or correct llm.base_url",
    )


def refused(exc: APIStatusError, url: str) -> RemoteLLMError:
    hint = {
        401: "set llm.api_key to the server's key",
        403: "set llm.api_key to the server's key",
        404: "check llm.base_url (it ends in /v1) and llm.remote_model",
    }.get(exc.status_code, "check the request settings")
    return RemoteLLMError(
        "refused",
        f"the LLM server at {url} refused the request with HTTP {exc.status_code} ({exc.message}); fix: {hint}",
    )
