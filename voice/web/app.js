// The specvoice page: talk to the assistant over its OpenAI-Realtime-style websocket, from any current browser.
//
// Plain ES module, no build step, nothing from another origin (the server's CSP allows only this origin).
// Audio: the microphone goes through an AudioWorklet that resamples to 24 kHz pcm16 (input_audio_buffer.append);
// reply audio (response.output_audio.delta) plays through another worklet that tells us what was actually
// played, so a barge-in can say how much of the reply the user heard (conversation.item.truncate).

import { drawWaterfall } from "./waterfall.js";

const WIRE_RATE = 24000;
const SUBPROTOCOL = "realtime";
const KEY_PREFIX = "openai-insecure-api-key.";
const HTTP_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;   // what a subprotocol may contain

const $ = (id) => document.getElementById(id);

// What tests (and curious people, in the console) can read.
const state = {
  status: "disconnected",
  connected: false,
  sessionId: null,
  micChunksSent: 0,
  micSamplesSent: 0,
  micLevel: 0,
  outputRate: null,
  playedFrames: 0,
  nonSilentFrames: 0,
  partial: "",
  transcript: "",
  transcripts: [],
  reply: "",
  replies: [],
  trace: null,
  traces: [],
  voiceToVoiceMs: null,
  playoutMs: null,
  truncates: [],
  errors: [],
  eventCounts: {},
};
window.specvoice = state;

let ws = null;
let ctx = null;
let mic = null;            // {stream, source, node}
let player = null;         // AudioWorkletNode
const turns = new Map();   // item_id or response_id -> the element that shows it
const responses = new Map();   // response_id -> {el, itemId, text, audioMs, firstDeltaAt, startedAt, status}
const itemToResponse = new Map();
const muted = new Set();   // items cut by a barge-in: late audio for them is dropped
let current = null;        // the response in progress
let playing = null;        // item id the player is playing, until it reports idle
let shownTrace = null;     // {trace, responseId}: the waterfall on screen

// ---- status and errors --------------------------------------------------------------------------------------

const STATUS_TEXT = {
  disconnected: "Not connected",
  connecting: "Connecting…",
  listening: "Listening",
  hearing: "Hearing you",
  thinking: "Thinking",
  speaking: "Speaking",
};

function setStatus(name, detail) {
  state.status = name;
  const el = $("status");
  el.dataset.state = name;
  el.textContent = detail ? `${STATUS_TEXT[name]} · ${detail}` : STATUS_TEXT[name];
}

function showError(code, message) {
  state.errors.push({ code, message });
  const box = $("errors");
  const item = document.createElement("div");
  item.className = "error";
  const title = document.createElement("strong");
  title.textContent = code;
  const text = document.createElement("span");
  text.textContent = message;
  const close = document.createElement("button");
  close.type = "button";
  close.className = "dismiss";
  close.setAttribute("aria-label", "Dismiss this error");
  close.textContent = "×";
  close.addEventListener("click", () => item.remove());
  item.append(title, text, close);
  box.prepend(item);
  while (box.children.length > 4) box.lastChild.remove();
}

// ---- conversation view ----------------------------------------------------------------------------------------

function bubble(key, role) {
  let el = turns.get(key);
  if (!el) {
    $("empty").hidden = true;
    el = document.createElement("li");
    el.className = `turn ${role}`;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : "Assistant";
    const text = document.createElement("p");
    text.className = "text";
    const note = document.createElement("span");
    note.className = "note";
    el.append(who, text, note);
    $("turns").append(el);
    turns.set(key, el);
  }
  el.scrollIntoView({ block: "nearest" });
  return el;
}

function setText(el, text, { partial = false } = {}) {
  const p = el.querySelector(".text");
  p.textContent = text;
  p.classList.toggle("partial", partial);
}

function setNote(el, note) {
  el.querySelector(".note").textContent = note;
}

// ---- the websocket --------------------------------------------------------------------------------------------

function realtimeUrl(token) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = new URL(`${scheme}://${location.host}/v1/realtime`);
  if (token && !HTTP_TOKEN.test(token)) url.searchParams.set("token", token);   // cannot be a subprotocol
  return url.toString();
}

function connect(token) {
  const protocols = [SUBPROTOCOL];
  if (token && HTTP_TOKEN.test(token)) protocols.push(KEY_PREFIX + token);
  setStatus("connecting");
  return new Promise((resolve, reject) => {
    const socket = new WebSocket(realtimeUrl(token), protocols);
    let opened = false;
    socket.onopen = () => { opened = true; resolve(socket); };
    socket.onmessage = (e) => onServerEvent(JSON.parse(e.data));
    socket.onerror = () => { if (!opened) reject(new Error("could not connect to the server")); };
    socket.onclose = (e) => {
      if (ws === socket) {
        const why = e.reason || (e.code === 1006 ? "connection lost" : `closed (${e.code})`);
        if (e.code !== 1000 || e.reason) showError(`closed ${e.code}`, why);
        stop();
      }
    };
  });
}

function send(event) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
}

function toBase64(int16) {
  const bytes = new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

function fromBase64(b64) {
  const binary = atob(b64);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  const view = new DataView(bytes.buffer);
  const out = new Int16Array(bytes.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true);   // little-endian on the wire
  return out;
}

// ---- server events --------------------------------------------------------------------------------------------

function onServerEvent(ev) {
  state.eventCounts[ev.type] = (state.eventCounts[ev.type] || 0) + 1;
  switch (ev.type) {
    case "session.created":
    case "session.updated":
      state.sessionId = ev.session.id;
      setStatus(state.status === "connecting" ? "listening" : state.status, ev.session.model);
      break;
    case "input_audio_buffer.speech_started":
      bargeIn();
      state.partial = "";
      setText(bubble(ev.item_id, "user"), "…", { partial: true });
      setStatus("hearing");
      break;
    case "input_audio_buffer.speech_stopped":
      setStatus("thinking");
      break;
    case "conversation.item.input_audio_transcription.delta": {
      const el = bubble(ev.item_id, "user");
      state.partial = (el.dataset.partial || "") + ev.delta;
      el.dataset.partial = state.partial;
      setText(el, state.partial, { partial: true });
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const el = bubble(ev.item_id, "user");
      state.transcript = ev.transcript;
      state.transcripts.push(ev.transcript);
      setText(el, ev.transcript || "(no words)", { partial: !ev.transcript });
      break;
    }
    case "conversation.item.input_audio_transcription.failed":
      setNote(bubble(ev.item_id, "user"), `transcription failed: ${ev.error?.message ?? ""}`);
      break;
    case "response.created":
      current = { id: ev.response.id, itemId: null, text: "", audioSamples: 0, firstDeltaAt: null,
                  startedAt: null, el: bubble(ev.response.id, "assistant") };
      responses.set(current.id, current);
      setText(current.el, "…", { partial: true });
      if (state.status !== "hearing") setStatus("thinking");
      break;
    case "response.output_item.added":
      if (responses.has(ev.response_id)) {
        responses.get(ev.response_id).itemId = ev.item.id;
        itemToResponse.set(ev.item.id, ev.response_id);
      }
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta": {
      const r = responses.get(ev.response_id);
      if (r) {
        r.text += ev.delta;
        setText(r.el, r.text);
      }
      break;
    }
    case "response.output_audio_transcript.done":
    case "response.output_text.done": {
      const r = responses.get(ev.response_id);
      if (r) {
        r.text = ev.transcript ?? ev.text ?? r.text;
        setText(r.el, r.text);
      }
      break;
    }
    case "response.output_audio.delta":
      playDelta(ev);
      break;
    case "response.output_audio.done":
      if (player && !muted.has(ev.item_id)) player.port.postMessage({ type: "flush", item: ev.item_id });
      break;
    case "specvoice.latency":
      shownTrace = { trace: ev.trace, responseId: ev.response_id };
      showTrace();
      break;
    case "response.done": {
      const r = responses.get(ev.response.id);
      if (r) {
        state.reply = r.text;
        state.replies.push(r.text);
        const details = ev.response.status_details;
        if (ev.response.status === "cancelled") {
          setNote(r.el, details?.reason === "turn_detected" ? "interrupted" : "cancelled");
        } else if (ev.response.status === "failed") {
          setNote(r.el, `failed: ${details?.error?.message ?? "unknown error"}`);
        }
        if (!r.text) setText(r.el, "(no reply)", { partial: true });
      }
      if (current && current.id === ev.response.id) current = null;
      if (!playing && state.status !== "hearing") setStatus("listening");
      break;
    }
    case "error":
      showError(ev.error?.code || ev.error?.type || "error", ev.error?.message || JSON.stringify(ev.error));
      break;
    default:
      break;   // events this page does not show (conversation.item.added, content parts, ...)
  }
}

// ---- audio ------------------------------------------------------------------------------------------------------

function playDelta(ev) {
  if (!player || muted.has(ev.item_id)) return;
  const r = responses.get(ev.response_id);
  const pcm = fromBase64(ev.delta);
  if (r) {
    r.audioSamples += pcm.length;
    if (r.firstDeltaAt === null) r.firstDeltaAt = performance.now();
  }
  player.port.postMessage({ type: "audio", item: ev.item_id, pcm }, [pcm.buffer]);
}

function onPlayerMessage(msg) {
  state.playedFrames = msg.playedFrames ?? state.playedFrames;
  state.nonSilentFrames = msg.nonSilentFrames ?? state.nonSilentFrames;
  state.outputRate = msg.rate ?? state.outputRate;
  if (msg.type === "started") {
    playing = msg.item;
    const r = responses.get(itemToResponse.get(msg.item));
    if (r && r.startedAt === null) {
      r.startedAt = performance.now();
      if (shownTrace && shownTrace.responseId === r.id) showTrace();   // its playout is known now
    }
    if (state.status !== "hearing") setStatus("speaking");
  } else if (msg.type === "idle") {
    playing = null;
    if (state.status === "speaking") setStatus("listening");
  } else if (msg.type === "cleared") {
    playing = null;
    if (msg.item) {
      const truncate = { type: "conversation.item.truncate", item_id: msg.item, content_index: 0,
                         audio_end_ms: msg.playedMs };
      state.truncates.push(truncate);
      send(truncate);
      const r = responses.get(itemToResponse.get(msg.item));
      if (r) setNote(r.el, `interrupted after ${(msg.playedMs / 1000).toFixed(1)} s of audio`);
    }
  }
}

// The user spoke over the reply: silence it now, and tell the server how much was heard.
function bargeIn() {
  const item = playing || (current && current.audioSamples > 0 ? current.itemId : null);
  if (!item || !player) return;
  muted.add(item);
  player.port.postMessage({ type: "clear", item });
}

function setLevel(percent) {
  $("level").style.width = `${percent}%`;
  $("level").parentElement.setAttribute("aria-valuenow", String(percent));
}

function onMicMessage(msg) {
  if (msg.type !== "audio") return;
  state.micLevel = msg.rms;
  setLevel(Math.min(100, Math.round(Math.sqrt(msg.rms) * 180)));
  if (!ws || ws.readyState !== WebSocket.OPEN) return;
  send({ type: "input_audio_buffer.append", audio: toBase64(msg.pcm) });
  state.micChunksSent += 1;
  state.micSamplesSent += msg.pcm.length;
}

// A promise that gives up: a browser with no audio output never starts its AudioContext, and says nothing.
function within(ms, promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(what)), ms); });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function startAudio() {
  ctx = new AudioContext({ latencyHint: "interactive" });
  await ctx.audioWorklet.addModule("worklet.js");
  if (ctx.state !== "running") {
    await within(5000, ctx.resume(), "the browser did not start audio output (is there an output device?)");
  }
  player = new AudioWorkletNode(ctx, "reply-player", { numberOfInputs: 0, outputChannelCount: [1] });
  player.port.onmessage = (e) => onPlayerMessage(e.data);
  player.connect(ctx.destination);
  state.outputRate = ctx.sampleRate;
}

async function startMic() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  const source = ctx.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(ctx, "mic-capture", { numberOfOutputs: 0, processorOptions: { chunkMs: 40 } });
  node.port.onmessage = (e) => onMicMessage(e.data);
  source.connect(node);
  mic = { stream, source, node };
}

// ---- latency --------------------------------------------------------------------------------------------------

// The browser's own share, which the server's trace cannot see: first audio delta received -> first sample
// played. The server's playback_start is when it sent that delta, so the bar starts there.
function playoutOf(responseId) {
  const r = responses.get(responseId);
  return r && r.firstDeltaAt !== null && r.startedAt !== null ? Math.round(r.startedAt - r.firstDeltaAt) : null;
}

function showTrace() {
  if (!shownTrace) return;
  const { trace, responseId } = shownTrace;
  state.trace = trace;
  if (!state.traces.includes(trace)) state.traces.push(trace);
  const stages = trace.stages_ms || {};
  const total = stages.voice_to_voice ?? stages.text_to_voice ?? null;
  state.voiceToVoiceMs = stages.voice_to_voice ?? null;
  state.playoutMs = playoutOf(responseId);
  drawWaterfall($("waterfall-svg"), trace, { playoutMs: state.playoutMs });
  const v2v = $("v2v");
  v2v.replaceChildren();
  if (total !== null) {
    const name = stages.voice_to_voice !== undefined ? "voice_to_voice" : "text_to_voice";
    const budget = trace.budget_ms?.[name];
    const over = (trace.over_budget || []).includes(name);
    const big = document.createElement("strong");
    big.className = over ? "over" : "ok";
    big.textContent = `${Math.round(total)} ms`;
    const label = document.createElement("span");
    label.textContent = `${name === "voice_to_voice" ? "voice to voice" : "text to voice"}` +
      (budget ? ` · budget ${Math.round(budget)} ms` : "");
    v2v.append(big, label);
  }
  const recent = state.traces.slice(-8).map((t) => t.stages_ms?.voice_to_voice ?? t.stages_ms?.text_to_voice)
    .filter((v) => v !== undefined).map((v) => Math.round(v));
  $("history").textContent = recent.length > 1 ? `Last turns: ${recent.join(", ")} ms` : "";
}

// ---- start and stop -------------------------------------------------------------------------------------------

async function start() {
  const button = $("start");
  button.disabled = true;
  try {
    await startAudio();
    ws = await connect($("token").value.trim());
    state.connected = true;
    $("typed").disabled = $("send").disabled = false;
    button.textContent = "Stop";
    button.setAttribute("aria-pressed", "true");
    try {
      await startMic();
    } catch (err) {
      showError("microphone", `${err.name || "Error"}: ${err.message}. You can still type.`);
    }
  } catch (err) {
    showError("connect", err.message || String(err));
    stop();
  } finally {
    button.disabled = false;
  }
}

function stop() {
  const socket = ws;
  ws = null;
  if (socket && socket.readyState <= WebSocket.OPEN) socket.close(1000, "page stopped");
  if (mic) {
    mic.node.port.postMessage({ type: "stop" });
    mic.stream.getTracks().forEach((t) => t.stop());
    mic = null;
  }
  if (ctx) ctx.close();
  ctx = player = null;
  playing = current = null;
  state.connected = false;
  $("typed").disabled = $("send").disabled = true;
  setLevel(0);
  const button = $("start");
  button.textContent = "Start talking";
  button.setAttribute("aria-pressed", "false");
  setStatus("disconnected");
}

function sendTyped(e) {
  e.preventDefault();
  const input = $("typed");
  const text = input.value.trim();
  if (!text || !ws) return;
  bargeIn();
  const id = `item_page${Date.now().toString(36)}`;
  setText(bubble(id, "user"), text);
  send({ type: "conversation.item.create", item: { id, type: "message", role: "user",
                                                   content: [{ type: "input_text", text }] } });
  send({ type: "response.create" });
  input.value = "";
}

function init() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has("token")) {
    $("token").value = params.get("token");
    history.replaceState(null, "", location.pathname + location.search);   // not left in the address bar
  }
  $("connect-form").addEventListener("submit", (e) => {
    e.preventDefault();
    if (ws) stop(); else start();
  });
  window.addEventListener("resize", () => showTrace());
  $("type-form").addEventListener("submit", sendTyped);
  if (!window.AudioWorkletNode || !navigator.mediaDevices) {
    showError("browser", "this page needs AudioWorklet and a microphone API: open it over https or on localhost");
  }
}

init();
