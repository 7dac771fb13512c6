// The assistant's page (/assistant): upload CSVs, ask, and watch the turn's display events as
// they come — the thinking channel (tool calls and results, collapsible), the text streaming,
// then cards (maps drawn locally, tables). A turn can be cancelled while it runs.

import { api, takeTokenFromFragment } from "./api.js";
import { mapCard } from "./map.js";
import { follow } from "./stream.js";
import { attempt, el, renderAccount, renderSignIn } from "./ui.js";

const $ = (id) => document.getElementById(id);
const BASE = "/api/v1/assistant";
const datasets = [];
let chat = null;       // the conversation id
let turn = null;       // the running turn
let stream = null;
let localSeq = 0;      // the page's own order for the messages it shows
const turns = new Map();  // turn id → its elements

function setTurnState(state, reason = "") {
  $("turn-state").textContent = state;
  $("turn-state").dataset.state = state;
  $("turn-reason").textContent = reason ? `— ${reason}` : "";
  const running = state === "Thinking";
  $("send-button").disabled = running;
  $("cancel-button").hidden = !running;
}

function streamStatus({ state, cursor, reconnects, message }) {
  const status = $("stream-status");
  status.textContent = message ? `${state}: ${message}` : `${state} (after ${cursor})`;
  status.dataset.state = state;
  status.dataset.reconnects = reconnects;
  if (state === "ended" && turn) finish(turn);  // ended without our seeing `done`: ask
}

async function upload() {
  const file = $("upload-input").files[0];
  if (!file) return;
  const form = new FormData();
  form.append("file", file, file.name);
  const done = await attempt($("data-error"), () => api("POST", `${BASE}/files`, { form }));
  $("upload-input").value = "";
  if (!done) return;
  datasets.push(done);
  $("datasets").append(el("li", { "data-dataset": done.dataset_id },
    `${done.name}: ${done.rows} rows, ${Array.isArray(done.columns) ? done.columns.length : done.columns} columns (attached)`));
}

/** The elements of ``id``'s turn in the transcript, made on first sight. */
function turnElements(id) {
  if (turns.has(id)) return turns.get(id);
  const steps = el("ol", { class: "list" });
  const thinking = el("details", { class: "thinking", "data-testid": "thinking" },
    el("summary", {}, "Thinking: tool calls and results"), steps);
  const text = el("span", { class: "text" });
  const cards = el("div", { class: "cards" });
  const item = el("li", { class: "message agent", "data-role": "agent", "data-seq": ++localSeq, "data-turn": id },
    el("span", { class: "who" }, "Assistant"), thinking, text, cards);
  $("transcript").append(item);
  const parts = { item, steps, text, cards, streamed: "" };
  turns.set(id, parts);
  return parts;
}

function tableCard(data) {
  const columns = data.columns || Object.keys((data.rows || [])[0] || {});
  const rows = data.rows || [];
  return el("figure", { class: "card", "data-testid": "table-card" },
    data.title ? el("figcaption", {}, el("strong", {}, data.title)) : null,
    el("table", {}, el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col" }, c)))),
      el("tbody", {}, rows.map((r) => el("tr", {}, columns.map((c, i) => el("td", {}, Array.isArray(r) ? r[i] : r[c])))))));
}

function showCard(parts, { card_type: type, card_data: data }, displayId) {
  const node = type === "map_display" ? mapCard(data, displayId)
    : type.includes("table") ? tableCard(data)
      : el("figure", { class: "card" }, el("figcaption", {}, type), el("pre", {}, JSON.stringify(data, null, 2)));
  // A singleton card (same display id) replaces its earlier version.
  const old = displayId && parts.cards.querySelector(`[data-display-id="${displayId}"]`);
  if (old) old.replaceWith(node);
  else parts.cards.append(node);
}

function onDisplay(_event, event) {
  const parts = turnElements(event.message_id);
  const data = event.data || {};
  switch (event.type) {
    case "busy":
      setTurnState("Thinking");
      break;
    case "reasoning":
      parts.steps.append(el("li", {}, data.text));
      break;
    case "tool_call":
      parts.steps.append(el("li", { "data-tool": data.tool }, el("strong", {}, `${data.tool} `),
        el("pre", {}, JSON.stringify(data.input, null, 1))));
      break;
    case "tool_result":
      parts.steps.append(el("li", {}, `${data.tool} answered in ${Math.round(data.duration_ms)} ms`,
        el("pre", {}, String(data.output).slice(0, 2000))));
      break;
    case "text_delta":
      parts.streamed += data.text;
      parts.text.textContent = parts.streamed;
      break;
    case "text_complete":
      parts.text.textContent = data.content;
      break;
    case "card":
      showCard(parts, data, event.display_id);
      break;
    case "error":
    case "warning":
      parts.steps.append(el("li", { class: "error" }, data.text));
      break;
    case "done":
      finish(event.message_id);
      break;
    default:
      break;
  }
}

async function finish(id) {
  const parts = turnElements(id);
  if (parts.finished) return;
  parts.finished = true;
  stream?.stop();
  stream = null;
  // `done` is shown before the turn's end is on the conversation's log: read it until it is.
  const path = `${BASE}/conversations/${chat}/turns/${encodeURIComponent(id)}`;
  let out = null;
  for (let tries = 0; tries < 60; tries += 1) {
    out = await attempt($("chat-error"), () => api("GET", path));
    if (!out || out.state !== "Thinking") break;
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
  if (out) setTurnState(out.state, out.reason || (out.state === "Replied" ? "" : out.end_reason || ""));
  if (turn === id) turn = null;
  $("message-input").focus();
}

async function send(event) {
  event.preventDefault();
  const message = $("message-input").value.trim();
  if (!message) return;
  const body = { message, stream: false, data_refs: datasets.map((d) => d.dataset_id) };
  if (chat) body.conversation_id = chat;
  const accepted = await attempt($("chat-error"), () => api("POST", `${BASE}/chat`, { json: body }));
  if (!accepted) return;
  $("message-input").value = "";
  chat = accepted.conversation_id;
  turn = accepted.turn;
  $("chat-id").textContent = `Chat ${chat}`;
  $("transcript").append(el("li", { class: "message participant", "data-role": "participant", "data-seq": ++localSeq },
    el("span", { class: "who" }, "You"), el("span", { class: "text" }, message)));
  turnElements(turn);
  setTurnState("Thinking");
  stream?.stop();
  stream = follow(`${BASE}/conversations/${chat}/stream`, {
    after: accepted.after, onEvent: onDisplay, onStatus: streamStatus,
    // The edge ends an idle stream: nothing runs, all sent. Then read the turn's end directly.
    endsOn: (comment) => comment.startsWith("end; idle") || comment.startsWith("end; turn done"),
  });
}

async function cancel() {
  if (!chat || !turn) return;
  const out = await attempt($("chat-error"), () => api("POST",
    `${BASE}/conversations/${chat}/turns/${encodeURIComponent(turn)}/cancel`));
  if (out) $("turn-reason").textContent = "— cancelling…";
}

function start() {
  $("signin").hidden = true;
  $("app").hidden = false;
  renderAccount($("account"));
  $("upload-input").addEventListener("change", upload);
  $("send-form").addEventListener("submit", send);
  $("message-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("send-form").requestSubmit();
  });
  $("cancel-button").addEventListener("click", cancel);
  $("new-chat").addEventListener("click", () => {
    stream?.stop();
    chat = null;
    turn = null;
    turns.clear();
    $("transcript").replaceChildren();
    $("chat-id").textContent = "No chat yet.";
    setTurnState("—");
  });
}

takeTokenFromFragment();
if (renderAccount($("account"))) start();
else {
  $("signin").hidden = false;
  renderSignIn($("signin"), { role: "participant", done: () => location.reload() });
}
