"""The one configuration object, loaded from TOML, environment and CLI flags.

Why pydantic: every key is validated on load and an error can name the file, the dotted key and the fix,
instead of failing later in a worker thread. Precedence, lowest to highest: the TOML file, environment
variables ``SPECVOICE_<SECTION>__<KEY>`` (double underscore between levels), then ``--set section.key=value``
flags on the command line.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from llm.prompts import SYSTEM
from llm.settings import (
    HISTORY_TOKENS,
    DecodeSettings,
    DraftLength,
    DraftQuantize,
    Dtype,
    EngineKind,
    LoadSettings,
    Mode,
    RemoteSettings,
    TargetQuantize,
    default_engine,
)
from voice.config_servers import MQTTConfig, ServerConfig, WyomingConfig
from voice.config_servers import Section as _Section
from voice.config_speech import HOTWORDS_MAX_CHARS, AudioConfig, STTConfig, TTSConfig, TurnConfig, VADConfig

# the shipped configs (default, small, gpu) travel inside the package (voice/configs links to the repository's
# configs/ folder, and the wheel carries copies), so an installed specvoice finds them from any directory
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"
ENV_PREFIX = "SPECVOICE_"
# the llm package owns the llm defaults (llm/settings.py): the config shows and validates them, never restates them
_LOAD, _DECODE = LoadSettings(), DecodeSettings()


class ConfigError(ValueError):
    """A configuration problem, phrased for the user: where, what, and how to fix it."""


class ModelsConfig(_Section):
    """Model names (see ``specvoice models list``), local paths, or hub ids."""

    target: str = "qwen2.5-coder-1.5b-instruct"
    draft: str | None = None
    stt: str = "whisper-tiny.en"
    tts: str = "piper-joe-medium"
    vad: str = "silero-vad"
    wake_word: str | None = Field(
        "hey_jarvis",
        description="the wake word of the device's own microphone (`specvoice run`): a turn opens only after it, "
        "or within audio.follow_up_s after a reply; '' for none (a desktop where speech is always for the "
        "assistant). Websocket, Wyoming and MQTT clients decide themselves when speech is meant for it",
    )
    turn: str = Field("smart-turn-v3.2", description="semantic end-of-turn model (used when turn.engine = 'smart')")
    cache_dir: str | None = Field(None, description="default: $XDG_CACHE_HOME/specvoice")


class LLMConfig(_Section):
    engine: EngineKind = Field(
        default_engine(_LOAD.device),
        description="llama.cpp: the GGUF on llama.cpp's CPU kernels; torch: transformers weights (GPU, and the "
        "float32 exactness reference); default: llama.cpp on the CPU, torch on a GPU",
    )
    device: str = _LOAD.device
    dtype: Dtype = _LOAD.dtype
    threads: int | None = Field(
        _LOAD.threads,
        ge=1,
        description="LLM compute threads (torch or llama.cpp); default: all cores, and with llama.cpp only those "
        "other programs leave free (measured as it runs)",
    )
    mode: Mode = _DECODE.mode
    draft_length: DraftLength = _DECODE.draft_length
    max_draft_length: int = Field(_DECODE.max_draft_length, ge=1, le=32)
    draft_confidence: float | None = Field(
        _DECODE.draft_confidence,
        gt=0.0,
        lt=1.0,
        description="draft_length = 'confidence': stop at this fixed threshold instead of the measured-cost rule",
    )
    tree: bool = Field(_DECODE.tree, description="token-tree verification: the draft's next-best tokens as siblings")
    tree_width: int = Field(
        _DECODE.tree_width, ge=1, le=8, description="tree: candidates per position (chain token + alternatives)"
    )
    draft_quantize: DraftQuantize = _LOAD.draft_quantize
    target_quantize: TargetQuantize = Field(_LOAD.target_quantize, description="int4 weights for the served target")
    draft_vocab: int | None = Field(_LOAD.draft_vocab, ge=256, description="reduced draft head size; None = full")
    max_new_tokens: int = Field(_DECODE.max_new_tokens, ge=1)
    temperature: float = Field(_DECODE.temperature, ge=0.0)
    top_k: int = Field(_DECODE.top_k, ge=0)
    top_p: float = Field(_DECODE.top_p, gt=0.0, le=1.0)
    seed: int | None = _DECODE.seed
    context_limit: int = Field(_LOAD.context_limit, ge=64)
    huge_pages: bool = Field(
        _LOAD.huge_pages,
        description="llama.cpp: move the weights into huge pages after the load (Linux; ~3 s a GB, then ~10% "
        "faster decoding); off, or where the kernel cannot, they stay in small pages",
    )
    prefill_chunk: int = Field(
        _DECODE.prefill_chunk, ge=0, description="prompt tokens per prefill pass (a cancel lands within one)"
    )
    # the remote backend (llm.backend = "openai"): an OpenAI-compatible chat-completions server (vLLM, SGLang,
    # llama.cpp's server, Ollama, transformers serve); the local keys above then only set temperature, top_k,
    # top_p, seed and max_new_tokens, and the server does its own speculative decoding
    backend: Literal["local", "openai"] = Field(
        "local",
        description="local: the speculative decoder in this process; openai: a chat-completions server at llm.base_url",
    )
    base_url: str | None = Field(None, description="e.g. 'http://gpu-box:8000/v1' (llm.backend = 'openai')")
    api_key: str | None = Field(
        RemoteSettings.api_key, description="sent as a bearer token; prefer SPECVOICE_LLM__API_KEY"
    )
    remote_model: str | None = Field(
        RemoteSettings.model, description="model name in requests; default: the server's first"
    )
    tokenizer: str | None = Field(
        None,
        description="a local tokenizer (model name or folder) to count history "
        "tokens exactly; default: about 4 characters per token",
    )
    connect_timeout_s: float = Field(RemoteSettings.connect_timeout_s, gt=0)
    first_token_timeout_s: float = Field(
        RemoteSettings.first_token_timeout_s,
        gt=0,
        description="from the request to the first token, retries "
        "included; also the longest silence allowed between two tokens",
    )
    retries: int = Field(
        RemoteSettings.retries, ge=0, le=10, description="retries before the first token (refused, 429, 5xx)"
    )
    metrics_url: str | None = Field(
        RemoteSettings.metrics_url,
        description="the server's Prometheus page for its speculative-decoding "
        "counters; default: <base_url host>/metrics; '' = do not scrape",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_engine(cls, data: Any) -> Any:
        """No engine named: llama.cpp on the CPU, torch on a GPU."""
        if isinstance(data, dict) and data.get("engine") is None:
            data = {**data, "engine": default_engine(data.get("device") or _LOAD.device)}
        return data

    @model_validator(mode="after")
    def _engine_for_device(self) -> LLMConfig:
        if self.engine == "llama.cpp" and self.device != "cpu":
            raise ValueError(
                f"llm.engine = 'llama.cpp' runs on the CPU, but llm.device = {self.device!r}; "
                "fix: set llm.engine = 'torch' for a GPU, or llm.device = 'cpu'"
            )
        return self

    @model_validator(mode="after")
    def _remote_needs_url(self) -> LLMConfig:
        if self.backend == "openai" and not self.base_url:
            raise ValueError(
                "llm.backend = 'openai' needs llm.base_url; fix: e.g. llm.base_url = 'http://gpu-box:8000/v1'"
            )
        return self


DEFAULT_SYSTEM_PROMPT = SYSTEM  # one owner: the prompt the LLM benchmarks and head counts were measured with


class DialogConfig(_Section):
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    history_tokens: int = Field(HISTORY_TOKENS, ge=64, description="oldest turns are dropped beyond this")
    stt_timeout_s: float = Field(30.0, gt=0, description="no state may hang: the final transcript must come by then")
    turn_timeout_s: float = Field(120.0, gt=0, description="a whole reply (generation + speech) must end by then")
    early_reply: bool = Field(
        True,
        description="start generating when the user pauses, before the endpoint; "
        "spoken only if the final transcript is the same, else dropped",
    )
    prefill_during_speech: bool = Field(
        True,
        description="prefill the LLM caches with the words heard so far while the user still speaks "
        "(after each Whisper pass; a word heard otherwise later costs only the tokens from it on)",
    )
    backchannels: bool = Field(
        True,
        description="speech during a reply holds its audio; 'mhm', 'yeah', a cough resume it where it stopped, "
        "anything else is a barge-in (speaker and WAV sinks; other transports barge in at once)",
    )
    backchannel_hold_s: float = Field(
        2.5, gt=0, description="a held reply waits this long for the words; then the speech is a barge-in"
    )


class BudgetConfig(_Section):
    """Per-stage latency budgets in milliseconds; a turn reports the stages that went over."""

    endpointing: float = 600
    stt_final: float = 400
    llm_first_token: float = 500
    first_fragment: float = 600
    tts_first_audio: float = 250
    playback_start: float = 50
    voice_to_voice: float = 1200


class LoggingConfig(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    format: Literal["json", "text"] = "json"


class Config(_Section):
    models: ModelsConfig = ModelsConfig()
    llm: LLMConfig = LLMConfig()
    dialog: DialogConfig = DialogConfig()
    stt: STTConfig = STTConfig()
    tts: TTSConfig = TTSConfig()
    vad: VADConfig = VADConfig()
    turn: TurnConfig = TurnConfig()
    audio: AudioConfig = AudioConfig()
    budget: BudgetConfig = BudgetConfig()
    server: ServerConfig = ServerConfig()
    wyoming: WyomingConfig = WyomingConfig()
    mqtt: MQTTConfig = MQTTConfig()
    logging: LoggingConfig = LoggingConfig()

    @model_validator(mode="after")
    def _draft_needed(self) -> Config:
        if self.llm.mode == "draft" and not self.models.draft and self.llm.backend == "local":
            raise ValueError("llm.mode = 'draft' needs models.draft; set it, or set llm.mode = 'ngram' or 'target'")
        return self


def stt_hotwords(stt: STTConfig, mqtt: MQTTConfig) -> list[str]:
    """The phrases Whisper is told to expect: ``stt.hotwords`` when set, else (the one place this default is
    made) the names of ``mqtt.devices`` and then their areas, as far as they fit in ``HOTWORDS_MAX_CHARS``.
    Names are what tiny.en mishears ("tv socket", "towel warmer"): they come first so a large home keeps them."""
    if stt.hotwords is not None:
        return list(stt.hotwords)
    devices = mqtt.devices
    phrases = list(dict.fromkeys([d.name for d in devices] + [d.area for d in devices if d.area]))
    kept: list[str] = []
    for phrase in phrases:
        if len(", ".join([*kept, phrase])) > HOTWORDS_MAX_CHARS:
            break
        kept.append(phrase)
    return kept


def _hint(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "remove it or check its spelling (see `specvoice config show` for every key)"
    if kind == "missing":
        return "add it"
    if kind.startswith("literal"):
        return "use one of the values listed above"
    return "change the value"


def _format(errors: Sequence[Mapping[str, Any]], source: str) -> str:
    """One line for one problem (what a service log shows), one line per problem under a heading otherwise."""
    lines = []
    for err in errors:
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        got_text = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{key}: {msg}" if "fix:" in msg else f"{key}: {msg}{got_text}; fix: {_hint(err)}")
    if len(lines) == 1:
        return f"invalid configuration in {source}: {lines[0]}"
    return "\n".join([f"invalid configuration in {source}:", *(f"  {line}" for line in lines)])


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {dotted!r}: {part!r} is not a section")
    node[parts[-1]] = value


def _parse_value(text: str) -> Any:
    """Read an override as TOML/JSON where it parses (numbers, booleans, lists), else as a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text


def find_config(path: str | Path) -> Path:
    """``path`` as given when it exists; else a shipped config by name (``small``, ``gpu.toml``), so an
    installed package needs no checkout. A missing file is a ConfigError that lists the shipped names."""
    path = Path(path)
    if path.exists():
        return path
    shipped = CONFIG_DIR / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    if path.parent == Path(".") and shipped.exists():
        return shipped
    names = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.toml")))
    raise ConfigError(
        f"config file {path} does not exist; fix: pass an existing file, or a shipped config by name ({names})"
    )


def credential_overrides(environ: dict[str, str]) -> list[tuple[str, str]]:
    """Secrets from systemd credentials (``LoadCredential=``): each file in ``$CREDENTIALS_DIRECTORY`` named
    like a config key (``mqtt.password``, ``server.token``; systemd's ``specvoice_`` directory prefix allowed)
    sets that key to its text. Why: the environment and a world-readable TOML are no place for secrets, and a
    service's credentials directory is readable by the service alone."""
    folder = environ.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return []
    try:
        entries = sorted(Path(folder).iterdir())
    except OSError as exc:
        raise ConfigError(
            f"credentials directory {folder} cannot be read ({exc.strerror}); fix: check the "
            "unit's LoadCredential= lines"
        ) from None
    out = []
    for entry in entries:
        dotted = entry.name.removeprefix("specvoice_")
        section, _, key = dotted.partition(".")
        if not key or section not in Config.model_fields:
            continue  # another program's credential
        try:
            out.append((dotted, entry.read_text().rstrip("\r\n")))
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(
                f"credential {entry.name} in {folder} cannot be read ({reason}); fix: point its "
                "LoadCredential= line at a readable file holding only the secret"
            ) from None
    return out


SECRET_KEYS = {("server", "token"), ("mqtt", "password")}


def _env_overrides(environ: dict[str, str]) -> list[tuple[str, Any]]:
    out = []
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX) and "__" in name:
            dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            out.append((dotted, _parse_value(value)))
    return out


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Load ``path`` (default: $SPECVOICE_CONFIG or configs/default.toml; a shipped config by name), then systemd
    credentials, then env, then ``section.key=value`` flags."""
    environ = dict(os.environ if environ is None else environ)
    path = find_config(path or environ.get("SPECVOICE_CONFIG") or DEFAULT_CONFIG)
    try:
        tree = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}; fix: correct the syntax at that line") from exc
    except OSError as exc:
        raise ConfigError(
            f"config file {path} cannot be read ({exc.strerror}); fix: make it readable by this "
            "user (a service reads /etc/specvoice through ConfigurationDirectory=)"
        ) from None
    sources = [str(path)]
    for dotted, value in credential_overrides(environ):
        _set_dotted(tree, dotted, value)
        sources.append(f"credential {dotted}")
    for dotted, value in _env_overrides(environ):
        _set_dotted(tree, dotted, value)
        sources.append(f"${ENV_PREFIX}{dotted.upper().replace('.', '__')}")
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        dotted, value = item.split("=", 1)
        _set_dotted(tree, dotted.strip(), _parse_value(value.strip()))
        sources.append(f"--set {dotted.strip()}")
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        origin = sources[0] if len(sources) == 1 else f"{sources[0]} (with {', '.join(sources[1:])})"
        raise ConfigError(_format(exc.errors(), origin)) from None


def config_to_toml(config: Config, *, secrets: bool = False) -> str:
    """Render the effective config as TOML (for `specvoice config show`); secrets are redacted unless asked."""
    lines: list[str] = []
    for section, values in config.model_dump().items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if value is not None and (section, key) in SECRET_KEYS and not secrets:
                lines.append(f"# {key} = (set, hidden; `config show --secrets` prints it)")
            elif value is None:
                lines.append(f"# {key} = (unset)")
            elif isinstance(value, dict):
                inner = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
                lines.append(f"{key} = {{{inner}}}")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    return "\n".join(lines)
