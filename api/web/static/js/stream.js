// Following a stream of the edge (docs/api.md "The stream"): `id:` is the stream's cursor, a
// reconnect resumes after the last id seen (`after=` and `Last-Event-ID`), comments carry no id.
// EventSource cannot send an Authorization header, so this reads the stream with fetch and a
// streaming reader. Events at or below the cursor are dropped: a reconnect never shows one twice,
// and since the edge sends everything after the cursor, nothing is missed.

import { authHeaders, currentToken, describe } from "./api.js";

const RETRY_MIN_MS = 250;
const RETRY_MAX_MS = 8000;

/** Split SSE text into frames; returns [frames, rest]. */
function frames(buffer) {
  const parts = buffer.replace(/\r\n?/g, "\n").split("\n\n");
  return [parts.slice(0, -1), parts[parts.length - 1]];
}

function parseFrame(frame) {
  const out = { id: null, event: "message", data: [], comment: null };
  for (const line of frame.split("\n")) {
    if (line.startsWith(":")) {
      out.comment = line.slice(1).trim();
      continue;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") out.id = value;
    else if (field === "event") out.event = value;
    else if (field === "data") out.data.push(value);
  }
  return out;
}

/**
 * Follow the stream at ``path`` after ``after``, reconnecting at every end until stopped.
 * ``onEvent(event, data, id)`` for each new event; ``onStatus({state, cursor, reconnects,
 * message})``; ``endsOn(comment)`` true stops following (e.g. a turn is done).
 */
export function follow(path, { after = 0, onEvent, onStatus = () => {}, endsOn = () => false }) {
  const control = new AbortController();
  const state = { cursor: after, reconnects: 0, stopped: false };
  const report = (name, message = "") =>
    onStatus({ state: name, cursor: state.cursor, reconnects: state.reconnects, message });

  async function readOnce() {
    if (!currentToken()) {  // signed out meanwhile: no request that can only be refused (401)
      report("stopped", "Signed out: sign in again to follow this.");
      return "stop";
    }
    const response = await fetch(`${path}?after=${state.cursor}`, {
      headers: authHeaders({ Accept: "text/event-stream", "Last-Event-ID": String(state.cursor) }),
      signal: control.signal,
    });
    if (response.status === 409) {
      // Older than this edge keeps: resume at its oldest (docs/api.md), and say so.
      const body = await response.json();
      report("gap", `Events up to ${body.oldest_cursor} are no longer kept here.`);
      state.cursor = body.oldest_cursor;
      return "again";
    }
    if (!response.ok) {
      let body = null;
      try { body = await response.json(); } catch { body = null; }
      const retryAfter = Number(response.headers.get("Retry-After")) || null;
      const message = describe(response.status, body, retryAfter);
      if ([429, 500, 503].includes(response.status)) {
        report("waiting", message);
        return retryAfter ? retryAfter * 1000 : "backoff";
      }
      report("stopped", message);
      return "stop";
    }
    report("live");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return "again";
      let ready;
      [ready, buffer] = frames(buffer + value);
      for (const text of ready) {
        const frame = parseFrame(text);
        if (frame.comment !== null && frame.id === null && frame.data.length === 0) {
          if (frame.comment.startsWith("end; the") || endsOn(frame.comment)) {
            report("ended", frame.comment);
            return "stop";
          }
          continue;
        }
        const id = frame.id === null ? null : Number(frame.id);
        if (id !== null && id <= state.cursor) continue;
        if (id !== null) state.cursor = id;
        onEvent(frame.event, frame.data.length ? JSON.parse(frame.data.join("\n")) : null, id);
        report("live");
      }
    }
  }

  (async () => {
    let delay = RETRY_MIN_MS;
    while (!state.stopped) {
      let next;
      try {
        next = await readOnce();
        if (next === "again") delay = RETRY_MIN_MS;
      } catch (error) {
        if (state.stopped || error.name === "AbortError") return;
        report("waiting", "The connection dropped; reconnecting.");
        next = "backoff";
      }
      if (next === "stop") return;
      if (typeof next === "number") delay = next;
      await new Promise((resolve) => setTimeout(resolve, delay));
      if (next === "backoff") delay = Math.min(delay * 2, RETRY_MAX_MS);
      if (state.stopped) return;
      state.reconnects += 1;
      report("reconnecting");
    }
  })();

  return {
    get cursor() { return state.cursor; },
    stop() {
      state.stopped = true;
      control.abort();
    },
  };
}
