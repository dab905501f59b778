// The page's two audio processors, run on the audio thread: the microphone going out (any device rate ->
// 24 kHz pcm16, the Realtime wire format) and the reply coming in (24 kHz pcm16 -> the context's rate).
//
// Why resample here and not ask for AudioContext({sampleRate: 24000}): Firefox refuses to connect a
// microphone whose rate differs from the context's, and Chromium's fake microphone reports 44.1 kHz whatever
// the device; the context runs at its default rate and these processors convert, one stream each, so chunk
// edges never click.

const WIRE_RATE = 24000;
const PHASES = 256;          // kernel table resolution between two input samples
const ZERO_CROSSINGS = 16;   // per side: Blackman-windowed sinc, about -74 dB stopband

// A streaming band-limited resampler for any rate ratio: windowed sinc, looked up in a table.
class Resampler {
  constructor(srcRate, dstRate) {
    this.step = srcRate / dstRate;                       // input samples per output sample
    const cutoff = Math.min(1, dstRate / srcRate) * 0.92;  // of the input's Nyquist: below both rates'
    this.half = Math.ceil(ZERO_CROSSINGS / cutoff);      // kernel half-width, in input samples
    const n = 2 * this.half * PHASES + 1;
    this.table = new Float32Array(n + 1);
    for (let i = 0; i < n; i++) {
      const x = i / PHASES - this.half;                   // distance in input samples
      const u = x / this.half;
      const window = 0.42 + 0.5 * Math.cos(Math.PI * u) + 0.08 * Math.cos(2 * Math.PI * u);
      const arg = Math.PI * cutoff * x;
      this.table[i] = cutoff * (x === 0 ? 1 : Math.sin(arg) / arg) * window;
    }
    this.reset();
  }

  reset() {
    this.history = new Float32Array(this.half);            // silence before the stream: its first sample is
    this.time = this.half;                                 // the first output's centre (no delay offset)
  }

  // Input samples in, the output samples that are ready out (the last `half` inputs wait for their future).
  push(input) {
    const joined = new Float32Array(this.history.length + input.length);
    joined.set(this.history);
    joined.set(input, this.history.length);
    const { table, half, step } = this;
    const out = new Float32Array(Math.max(0, Math.ceil((joined.length - half - this.time) / step) + 1));
    let t = this.time;
    let count = 0;
    while (Math.floor(t) + half < joined.length) {
      const base = Math.floor(t);
      let acc = 0;
      for (let j = base - half + 1; j <= base + half; j++) {
        const pos = (j - t + half) * PHASES;               // table index of this input's distance from t
        const i = Math.floor(pos);
        acc += joined[j] * (table[i] + (table[i + 1] - table[i]) * (pos - i));
      }
      out[count++] = acc;
      t += step;
    }
    const keepFrom = Math.max(0, Math.floor(t) - half + 1);  // the first input the next output needs
    this.history = joined.slice(keepFrom);
    this.time = t - keepFrom;
    return out.subarray(0, count);
  }

  // End of a stream: the held-back tail (by pushing the silence that follows it).
  flush() {
    const out = this.push(new Float32Array(2 * this.half + 2));
    this.reset();
    return out;
  }
}

// Microphone -> 24 kHz int16 chunks posted to the page (transferred, not copied), with their level.
class MicCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { chunkMs = 40 } = options.processorOptions || {};
    this.resampler = new Resampler(sampleRate, WIRE_RATE);
    this.chunk = new Int16Array(Math.round(WIRE_RATE * chunkMs / 1000));
    this.filled = 0;
    this.running = true;
    this.port.onmessage = (e) => { if (e.data && e.data.type === "stop") this.running = false; };
  }

  process(inputs) {
    const channels = inputs[0];
    if (channels && channels.length) {
      let mono = channels[0];
      if (channels.length > 1) {                           // mix down: a stereo mic must not lose a side
        mono = new Float32Array(mono.length);
        for (const ch of channels) for (let i = 0; i < ch.length; i++) mono[i] += ch[i] / channels.length;
      }
      for (const s of this.resampler.push(mono)) {
        this.chunk[this.filled++] = Math.max(-32768, Math.min(32767, Math.round(s * 32768)));
        if (this.filled === this.chunk.length) this.send();
      }
    }
    return this.running;
  }

  send() {
    const pcm = this.chunk;
    const size = pcm.length;          // read before the transfer empties it
    let sum = 0;
    for (const v of pcm) sum += v * v;
    this.port.postMessage({ type: "audio", pcm, rms: Math.sqrt(sum / size) / 32768 }, [pcm.buffer]);
    this.chunk = new Int16Array(size);
    this.filled = 0;
  }
}

// Reply audio: 24 kHz int16 chunks queued per item, played gaplessly; reports what was actually played.
class ReplyPlayer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.resampler = new Resampler(WIRE_RATE, sampleRate);
    this.queue = [];               // {item, data: Float32Array at sampleRate, offset}
    this.item = null;              // the item now playing
    this.itemFrames = new Map();   // item -> frames played
    this.playedFrames = 0;         // frames of reply audio handed to the output, all items
    this.nonSilentFrames = 0;      // of those, frames above -60 dBFS
    this.lastReport = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  onMessage(msg) {
    if (msg.type === "audio") {
      const floats = new Float32Array(msg.pcm.length);
      for (let i = 0; i < floats.length; i++) floats[i] = msg.pcm[i] / 32768;
      this.enqueue(msg.item, this.resampler.push(floats));
    } else if (msg.type === "flush") {             // the item's audio is complete: play its tail too
      this.enqueue(msg.item, this.resampler.flush());
    } else if (msg.type === "clear") {             // barge-in: silence now, say how much was heard
      const item = this.item ?? (this.queue[0] && this.queue[0].item) ?? msg.item;
      this.queue = [];
      this.resampler.reset();
      this.item = null;
      this.port.postMessage({ type: "cleared", item, playedMs: this.playedMs(item), ...this.counts() });
    }
  }

  enqueue(item, data) {
    if (data.length) this.queue.push({ item, data, offset: 0 });
  }

  playedMs(item) {
    return Math.round(((this.itemFrames.get(item) || 0) / sampleRate) * 1000);
  }

  counts() {
    return { playedFrames: this.playedFrames, nonSilentFrames: this.nonSilentFrames, rate: sampleRate };
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    let i = 0;
    while (i < out.length && this.queue.length) {
      const head = this.queue[0];
      if (head.item !== this.item) {
        this.item = head.item;
        this.port.postMessage({ type: "started", item: head.item, at: currentTime + i / sampleRate });
      }
      const n = Math.min(out.length - i, head.data.length - head.offset);
      for (let k = 0; k < n; k++) {
        const s = head.data[head.offset + k];
        out[i + k] = s;
        if (s > 0.001 || s < -0.001) this.nonSilentFrames++;
      }
      head.offset += n;
      i += n;
      this.playedFrames += n;
      this.itemFrames.set(head.item, (this.itemFrames.get(head.item) || 0) + n);
      if (head.offset === head.data.length) this.queue.shift();
    }
    for (let ch = 1; ch < outputs[0].length; ch++) outputs[0][ch].set(out);
    const idle = this.queue.length === 0 && this.item !== null;
    if (idle || currentTime - this.lastReport > 0.1) {
      this.lastReport = currentTime;
      this.port.postMessage({ type: idle ? "idle" : "progress", item: this.item,
                              playedMs: this.playedMs(this.item), ...this.counts() });
      if (idle) this.item = null;
    }
    return true;
  }
}

registerProcessor("mic-capture", MicCapture);
registerProcessor("reply-player", ReplyPlayer);
