// The per-turn latency waterfall: each stage of the server's trace (specvoice.latency) as a horizontal bar on
// one time axis, so where the time went is seen at a glance. Stages mirror voice/latency.py (STAGES): a stage
// runs from the first of its start marks that is present to its end mark. Marks are milliseconds from the
// turn's first mark. Stages over their budget are drawn red with the budget as a dashed tick.

const SVG = "http://www.w3.org/2000/svg";

// name, start marks (first present wins), end mark, label; kind: "context" (not a cost), "total", "client"
const ROWS = [
  { name: "speech", from: ["speech_start"], to: "speech_end", label: "you speak", kind: "context" },
  { name: "endpointing", from: ["speech_end"], to: "endpoint", label: "end of turn (VAD)" },
  { name: "stt_final", from: ["endpoint"], to: "stt_final", label: "final transcript" },
  { name: "llm_first_token", from: ["stt_final", "turn_start"], to: "llm_first_token", label: "first token" },
  { name: "first_fragment", from: ["llm_first_token"], to: "first_fragment", label: "first clause" },
  { name: "tts_first_audio", from: ["first_fragment"], to: "tts_first_audio", label: "first speech (TTS)" },
  { name: "playback_start", from: ["tts_first_audio"], to: "playback_start", label: "audio out" },
  { name: "playout", label: "browser playout", kind: "client" },
  { name: "reply", from: ["playback_start"], to: "turn_end", label: "reply streams", kind: "context" },
  { name: "voice_to_voice", from: ["speech_end"], to: "playback_start", label: "voice to voice", kind: "total" },
  { name: "text_to_voice", from: ["turn_start"], to: "playback_start", label: "text to voice", kind: "total" },
];

const LABEL_W = 140;
const VALUE_W = 128;
const ROW_H = 26;
const AXIS_H = 28;
const BAR_H = 14;

function el(name, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  return node;
}

// A round tick step giving at most `most` ticks over `span` ms.
function niceStep(span, most) {
  for (const step of [10, 20, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000]) {
    if (span / step <= most) return step;
  }
  return 50000;
}

// The rows this trace can draw: [{row, start, end, ms}], in pipeline order.
export function waterfallRows(trace, { playoutMs = null } = {}) {
  const marks = trace.marks_ms || {};
  const stages = trace.stages_ms || {};
  const out = [];
  for (const row of ROWS) {
    if (row.kind === "client") {
      if (playoutMs !== null && marks.playback_start !== undefined) {
        out.push({ row, start: marks.playback_start, end: marks.playback_start + playoutMs, ms: playoutMs });
      }
      continue;
    }
    const from = row.from.find((m) => marks[m] !== undefined);
    if (from === undefined || marks[row.to] === undefined) continue;
    const start = marks[from];
    const end = Math.max(start, marks[row.to]);   // an early reply's first token can precede its transcript
    out.push({ row, start, end, ms: stages[row.name] ?? Math.round(end - start) });
  }
  return out;
}

// Drawn at the element's own width (one SVG unit = one CSS pixel), so text keeps its size on any screen.
export function drawWaterfall(svg, trace, options = {}) {
  const WIDTH = Math.max(400, Math.round(svg.parentElement.clientWidth || 640));
  const rows = waterfallRows(trace, options);
  const over = new Set(trace.over_budget || []);
  const budgets = trace.budget_ms || {};
  const tmax = Math.max(1, ...rows.map((r) => r.end));
  const plotW = WIDTH - LABEL_W - VALUE_W;
  const seconds = tmax >= 2000;                          // axis in s past two seconds, else in ms
  const step = niceStep(tmax, Math.max(2, Math.floor(plotW / (seconds ? 32 : 40))));   // label widths
  const span = Math.ceil(tmax / step) * step;
  const x = (ms) => LABEL_W + (ms / span) * plotW;
  const height = AXIS_H + rows.length * ROW_H + 6;

  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${height}`);
  const summary = rows.filter((r) => r.row.kind !== "context")
    .map((r) => `${r.row.label} ${Math.round(r.ms)} ms${over.has(r.row.name) ? " (over budget)" : ""}`).join("; ");
  svg.append(el("title", {}, `Latency of turn ${trace.turn_id ?? ""}: ${summary}`));

  const axis = el("g", { class: "axis" });
  for (let t = 0; t <= span + 1e-9; t += step) {
    axis.append(el("line", { x1: x(t), x2: x(t), y1: AXIS_H - 6, y2: height, class: "grid" }));
    axis.append(el("text", { x: x(t), y: AXIS_H - 11, "text-anchor": "middle" },
                   seconds ? (t / 1000).toFixed(step % 1000 ? 1 : 0) : `${t}`));
  }
  axis.append(el("text", { x: LABEL_W - 10, y: AXIS_H - 11, "text-anchor": "end", class: "unit" },
                 seconds ? "s" : "ms"));
  svg.append(axis);

  rows.forEach((r, i) => {
    const y = AXIS_H + i * ROW_H;
    const isOver = over.has(r.row.name);
    const g = el("g", { class: `row ${r.row.kind || "stage"}${isOver ? " over" : ""}`, "data-stage": r.row.name });
    g.append(el("title", {}, `${r.row.name}: ${Math.round(r.ms)} ms` +
                (budgets[r.row.name] ? ` (budget ${budgets[r.row.name]} ms)` : "")));
    if (i % 2 === 0) g.append(el("rect", { x: 0, y, width: WIDTH, height: ROW_H, class: "stripe" }));
    g.append(el("text", { x: LABEL_W - 10, y: y + ROW_H / 2 + 4, "text-anchor": "end", class: "label" },
                r.row.label));
    const w = Math.max(2, x(r.end) - x(r.start));
    g.append(el("rect", { x: x(r.start), y: y + (ROW_H - BAR_H) / 2, width: w, height: BAR_H, rx: 3,
                          class: "bar" }));
    const budget = budgets[r.row.name];
    if (budget !== undefined && r.row.kind !== "context" && r.start + budget <= span) {
      g.append(el("line", { x1: x(r.start + budget), x2: x(r.start + budget), y1: y + 3, y2: y + ROW_H - 3,
                            class: "budget" }));
    }
    const value = `${Math.round(r.ms)} ms` + (isOver && budget !== undefined ? ` > ${Math.round(budget)}` : "");
    g.append(el("text", { x: WIDTH - 6, y: y + ROW_H / 2 + 4, "text-anchor": "end", class: "value" }, value));
    svg.append(g);
  });
}
