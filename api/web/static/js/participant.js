// The participant's page (/): conversations, one conversation's live transcript (the stream
// resumes after the last seq it saw, so a cut connection shows nothing twice and misses
// nothing), the turn state and proposal, erasure; followed issues, the live inbox, contributing.

import { api, apiPage, takeTokenFromFragment } from "./api.js";
import { follow } from "./stream.js";
import { attempt, el, renderAccount, renderSignIn, when } from "./ui.js";

const $ = (id) => document.getElementById(id);
const LIST_PAGE = 100; // conversations a page of the list shows (older ones on request)
let stream = null;
let current = null;

function messageItem({ seq, role, text, at }) {
  return el("li", { class: `message ${role}`, "data-role": role, "data-seq": seq },
    el("span", { class: "who" }, role === "agent" ? "Voice" : "You"),
    el("span", { class: "text" }, text),
    at ? el("time", { datetime: at }, when(at)) : null);
}

/** Put a message in the transcript in seq order, once (an element per seq); drafts last. */
function addMessage(message) {
  const transcript = $("transcript");
  if (message.role === "agent" && message.turn) dropDraft(message.turn);
  if (transcript.querySelector(`[data-seq="${message.seq}"]`)) return;
  const later = [...transcript.children].find((li) =>
    li.dataset.draft !== undefined || Number(li.dataset.seq) > message.seq);
  transcript.insertBefore(messageItem(message), later || null);
  transcript.lastElementChild?.scrollIntoView({ block: "nearest" });
}

// A reply as the model writes it (``delta`` events, docs/api.md): a draft per turn, replaced
// by the turn's agent message. Not a message: no data-role, no data-seq.
const drafts = new Map();

function showDelta({ turn, attempt, offset, text }) {
  let draft = drafts.get(turn);
  if (!draft) {
    const li = el("li", { class: "message agent draft", "data-draft": turn, "aria-busy": "true" },
      el("span", { class: "who" }, "Voice"), el("span", { class: "text" }, ""));
    $("transcript").append(li);
    draft = { attempt, text: "", li };
    drafts.set(turn, draft);
  }
  if (attempt > draft.attempt) Object.assign(draft, { attempt, text: "" });  // written anew
  if (attempt < draft.attempt || offset > draft.text.length) return;  // stale, or a gap
  draft.text = draft.text.slice(0, offset) + text;
  draft.li.querySelector(".text").textContent = draft.text;
  draft.li.scrollIntoView({ block: "nearest" });
}

function dropDraft(turn) {
  drafts.get(turn)?.li.remove();
  drafts.delete(turn);
}

// The turns the stream has told of: a message's 202 may come after its whole turn has
// streamed by (the turn is fast, the answer slow), and must not set it back to Thinking.
const turnsSeen = new Set();

function showTurn({ turn, state, reason }) {
  if (turn) turnsSeen.add(turn);
  if (state !== "Thinking") dropDraft(turn);
  $("turn-state").textContent = state;
  $("turn-state").dataset.state = state;
  $("turn-reason").textContent = reason ? `— ${reason}` : "";
  $("send-button").disabled = state === "Thinking";
}

function showProposal(proposal) {
  const box = $("proposal");
  const concerns = proposal.concerns || [];
  box.replaceChildren(...[el("h3", {}, "What Voice heard"),
    concerns.length
      ? el("ul", {}, concerns.map((c) => el("li", {}, c.statement, c.quote ? [" — ", el("q", {}, c.quote)] : null)))
      : el("p", {}, "No concern found."),
    proposal.relates_to_issue
      ? el("p", {}, "Related to issue ", el("code", {}, proposal.relates_to_issue.issue || proposal.relates_to_issue), ".")
      : null,
    proposal.new_issue
      ? el("p", {}, "Proposed new issue: ", el("strong", {}, proposal.new_issue.title), ` — ${proposal.new_issue.summary || ""}`)
      : null].filter(Boolean));
  box.hidden = false;
}

function onEvent(event, data) {
  if (event === "message") addMessage(data);
  else if (event === "turn") showTurn(data);
  else if (event === "proposal") showProposal(data.proposal);
  else if (event === "delta") showDelta(data);
}

function streamStatus({ state, cursor, reconnects, message }) {
  const status = $("stream-status");
  status.textContent = message ? `${state}: ${message}` : `${state} (after ${cursor})`;
  status.dataset.state = state;
  status.dataset.cursor = cursor;
  status.dataset.reconnects = reconnects;
}

async function openConversation(conversation) {
  stream?.stop();
  current = conversation;
  $("no-conversation").hidden = true;
  $("conversation").hidden = false;
  $("conversation-id").textContent = conversation;
  $("transcript").replaceChildren();
  drafts.clear();
  turnsSeen.clear();
  $("proposal").hidden = true;
  $("turn-state").textContent = "—";
  $("turn-reason").textContent = "";
  $("send-button").disabled = false;
  for (const li of $("conversations").children) {
    li.firstChild.setAttribute("aria-current", li.dataset.conversation === conversation ? "true" : "false");
  }
  // The whole history comes from the stream (after=0): one path, one dedupe by seq.
  stream = follow(`/me/conversations/${conversation}/stream`, { after: 0, onEvent, onStatus: streamStatus });
  $("message-input").focus();
}

/** The newest page of the caller's conversations; older ones a page at a time on request. */
async function loadConversations() {
  const page = await attempt($("list-error"), () => apiPage(`/me/conversations?limit=${LIST_PAGE}`));
  if (!page) return;
  $("conversations").replaceChildren(...page.items.map(conversationItem));
  showOlder(page.next);
}

function conversationItem({ conversation, last_seq: lastSeq }) {
  return el("li", { "data-conversation": conversation },
    el("button", { type: "button", class: "link", onclick: () => openConversation(conversation) },
      lastSeq == null ? conversation : `${conversation} (${lastSeq})`));
}

/** The "older conversations" button, for the page at `next` (none when null). */
function showOlder(next) {
  const button = $("older-conversations");
  button.hidden = !next;
  button.onclick = next ? async () => {
    button.disabled = true;
    const page = await attempt($("list-error"), () => apiPage(next));
    button.disabled = false;
    if (!page) return;
    const shown = new Set([...$("conversations").children].map((li) => li.dataset.conversation));
    $("conversations").prepend(...page.items.filter((c) => !shown.has(c.conversation))
      .map(conversationItem));
    showOlder(page.next);
  } : null;
}

async function newConversation() {
  const created = await attempt($("list-error"), () => api("POST", "/me/conversations"));
  if (!created) return;
  await loadConversations();
  await openConversation(created.conversation);
}

async function send(event) {
  event.preventDefault();
  const input = $("message-input");
  const text = input.value.trim();
  if (!text || !current) return;
  const key = crypto.randomUUID();  // the same key on a retry: recorded once
  const conversation = current;
  const accepted = await attempt($("conversation-error"), () => api("POST",
    `/me/conversations/${conversation}/messages`, { json: { text }, headers: { "Idempotency-Key": key } }));
  if (!accepted || conversation !== current) return;
  input.value = "";
  addMessage({ seq: accepted.message.seq, role: "participant", text: accepted.message.text, at: accepted.message.at });
  if (!turnsSeen.has(accepted.turn)) showTurn({ turn: accepted.turn, state: "Thinking", reason: null });
}

async function erase() {
  const conversation = current;
  stream?.stop();  // first: a reconnect after the erasure would only meet a 404
  const done = await attempt($("conversation-error"), async () => {
    await api("DELETE", `/me/conversations/${conversation}`);
    return true;
  });
  $("erase-confirm").hidden = true;
  if (!done) {
    await openConversation(conversation);
    return;
  }
  current = null;
  $("conversation").hidden = true;
  $("no-conversation").hidden = false;
  $("no-conversation").textContent = `Conversation ${conversation} was erased.`;
  await loadConversations();
}

// --- issues and the inbox --------------------------------------------------------------------

function addNotification(n) {
  const inbox = $("inbox");
  if (inbox.querySelector(`[data-seq="${n.seq}"]`)) return;
  inbox.prepend(el("li", { "data-seq": n.seq, "data-testid": "notification" },
    el("strong", {}, n.title), ` (${n.issue}) `, el("span", {}, n.body), " ", el("time", { datetime: n.at }, when(n.at))));
}

/** The issues the caller follows (GET /me/issues), each with a way to stop following. */
async function loadFollowed() {
  const issues = await attempt($("issues-error"), () => api("GET", "/me/issues"));
  if (!issues) return;
  $("followed").replaceChildren(...(issues.length ? issues.map(({ issue, title }) =>
    el("li", { "data-issue": issue }, `${title} (${issue}) `,
      el("button", { type: "button", class: "link", "aria-label": `Stop following ${title}`,
        onclick: () => setFollowing(issue, false) }, "Unfollow")))
    : [el("li", { class: "meta" }, "You follow no issue yet.")]));
}

async function setFollowing(issue, following) {
  const done = await attempt($("issues-error"), () => api(following ? "POST" : "DELETE",
    `/me/issues/${encodeURIComponent(issue)}/follow`));
  if (done) await loadFollowed();
  return done;
}

async function followIssue(event) {
  event.preventDefault();
  if (await setFollowing($("follow-issue").value.trim(), true)) $("follow-issue").value = "";
}

async function contribute(event) {
  event.preventDefault();
  const issue = $("contribute-issue").value.trim();
  const text = $("contribute-text").value.trim();
  const done = await attempt($("issues-error"), () => api("POST",
    `/me/issues/${encodeURIComponent(issue)}/contributions`, { json: { text } }));
  if (!done) return;
  $("contribute-text").value = "";
  $("contribute-status").textContent = `Thank you: contribution ${done.contribution} is in review; it is published only once reviewers agree.`;
}

function start() {
  $("signin").hidden = true;
  $("app").hidden = false;
  renderAccount($("account"));
  $("new-conversation").addEventListener("click", newConversation);
  $("send-form").addEventListener("submit", send);
  $("message-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("send-form").requestSubmit();
  });
  $("erase").addEventListener("click", () => { $("erase-confirm").hidden = false; $("erase-confirm").focus(); });
  $("erase-confirm").addEventListener("click", erase);
  $("follow-form").addEventListener("submit", followIssue);
  $("contribute-form").addEventListener("submit", contribute);
  loadConversations();
  loadFollowed();
  follow("/me/inbox/stream", { after: 0, onEvent: (event, data) => event === "notification" && addNotification(data) });
}

takeTokenFromFragment();
if (renderAccount($("account"))) start();
else {
  $("signin").hidden = false;
  renderSignIn($("signin"), { role: "participant", done: () => location.reload() });
}
