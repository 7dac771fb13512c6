// The staff page (/staff): issues with their evidence, developments (and their delivery),
// research runs with suggestions and reasons, investigations; the review queue, live (read once,
// then followed on its stream), with flagged spans highlighted and approve / redact / reject
// (the second-reviewer rule shown, not just enforced); a workflow's state and, for operators,
// retrying a failed one.

import { api, claims, takeTokenFromFragment } from "./api.js";
import { follow } from "./stream.js";
import { attempt, el, renderAccount, renderSignIn, when } from "./ui.js";

const $ = (id) => document.getElementById(id);
const RESEARCH_POLL_MS = 1000;
const enc = encodeURIComponent;

// --- issues ----------------------------------------------------------------------------------

const ISSUES_PAGE = 25;
let issuesNext = null;

function issueItem({ issue, title, followers }) {
  return el("li", { "data-issue": issue },
    el("button", { type: "button", class: "link", onclick: () => showIssue(issue) }, title),
    el("span", { class: "meta" }, ` ${issue}, ${followers} following`));
}

/** The tenant's issues, newest first (GET /staff/issues); ``more`` appends the next page. */
async function loadIssues(more = false) {
  const query = `limit=${ISSUES_PAGE}${more && issuesNext ? `&before=${enc(issuesNext)}` : ""}`;
  const page = await attempt($("issues-error"), () => api("GET", `/staff/issues?${query}`));
  if (!page) return;
  const items = page.issues.map(issueItem);
  if (more) $("issue-list").append(...items);
  else $("issue-list").replaceChildren(...items);
  issuesNext = page.next;
  $("more-issues").hidden = !issuesNext;
}

function section(title, ...children) {
  return el("div", {}, el("h3", {}, title), ...children);
}

function form(id, fields, submit, onsubmit) {
  return el("form", { id, onsubmit: (e) => { e.preventDefault(); onsubmit(e.target); } },
    fields.map(([name, label, kind = "input", extra = {}]) => [
      el("label", { for: `${id}-${name}` }, label),
      el(kind, { id: `${id}-${name}`, name, rows: kind === "textarea" ? 2 : null, ...extra })]),
    el("div", { class: "row" }, el("button", { type: "submit" }, submit)));
}

function value(formNode, name) {
  return formNode.elements[name].value.trim();
}

async function showIssue(issue) {
  const v = await attempt($("issues-error"), () => api("GET", `/staff/issues/${enc(issue)}`));
  if (!v) return;
  const box = $("issue");
  box.hidden = false;
  box.dataset.issue = v.issue;
  const counts = Object.entries(v.contributions || {}).map(([k, n]) => `${n} ${k.replace("_", " ")}`).join(", ");
  box.replaceChildren(
    el("h3", {}, v.title, el("span", { class: "badge" }, v.issue)),
    el("p", {}, v.summary || ""),
    el("p", { class: "meta" }, `Opened by ${v.created_by}; ${v.followers} following; contributions: ${counts || "none"}.`),
    section("Evidence",
      el("ul", { class: "list" }, v.evidence.map((e) => el("li", {}, el("strong", {}, e.title), " ",
        e.body || "", e.url ? [" ", el("a", { href: e.url, rel: "noopener noreferrer" }, e.url)] : null,
        el("span", { class: "meta" }, ` — ${e.added_by}, ${when(e.at)}`)))),
      form("evidence", [["title", "Evidence title"], ["body", "Text", "textarea"], ["url", "URL (optional)"]],
        "Add evidence", async (f) => {
          const body = { title: value(f, "title"), body: value(f, "body") || null, url: value(f, "url") || null };
          if (await attempt($("issues-error"), () => api("POST", `/staff/issues/${enc(v.issue)}/evidence`, { json: body }))) showIssue(v.issue);
        })),
    section("Developments",
      el("ul", { class: "list", "data-testid": "developments" }, v.developments.map((d) => el("li", {},
        el("strong", {}, d.title), ` ${d.body} `, el("span", { class: "badge", "data-delivery": d.delivery }, d.delivery)))),
      form("development", [["title", "Development title"], ["body", "What happened", "textarea"]],
        "Record development", async (f) => {
          const body = { title: value(f, "title"), body: value(f, "body") };
          if (await attempt($("issues-error"), () => api("POST", `/staff/issues/${enc(v.issue)}/developments`, { json: body }))) {
            setTimeout(() => showIssue(v.issue), 1500);  // its delivery moves on in a workflow
          }
        })),
    section("Research",
      el("ul", { class: "list" }, v.research_runs.map((r) => el("li", {},
        el("button", { type: "button", class: "link", onclick: () => showResearch(r.run) }, r.run), ` ${r.state}`))),
      el("button", { type: "button", onclick: () => startResearch(v.issue) }, "Start a research run"),
      el("div", { id: "research", "data-testid": "research" })),
    section("Investigations",
      el("ul", { class: "list" }, v.investigations.map((i) => investigationItem(i)))));
}

function investigationItem(i) {
  return el("li", {}, el("strong", {}, i.title), ` — ${i.reason} `, el("span", { class: "badge" }, i.state),
    i.state === "suggested"
      ? el("button", { type: "button", class: "secondary", onclick: async () => {
        if (await attempt($("issues-error"), () => api("POST", `/staff/investigations/${enc(i.investigation)}/open`))) showIssue(i.issue);
      } }, "Open investigation")
      : ` (opened by ${i.opened_by})`);
}

async function startResearch(issue) {
  const run = await attempt($("issues-error"), () => api("POST", `/staff/issues/${enc(issue)}/research`));
  if (run) showResearch(run.run);
}

async function showResearch(run) {
  const box = $("research");
  box.replaceChildren(el("p", { role: "status" }, `Research run ${run}: running…`));
  for (;;) {
    const r = await attempt($("issues-error"), () => api("GET", `/staff/research/${enc(run)}`));
    if (!r || !box.isConnected) return;
    if (r.state === "Running") {
      await new Promise((resolve) => setTimeout(resolve, RESEARCH_POLL_MS));
      continue;
    }
    const s = r.suggestions || { sources: [], questions: [], investigations: [] };
    const list = (title, items) => section(title, el("ul", { class: "list" }, items.map((x) =>
      el("li", {}, el("strong", {}, x.title), ` — because ${x.reason}`,
        x.investigation && x.state === "suggested"
          ? [" ", el("button", { type: "button", class: "secondary", onclick: async () => {
            if (await attempt($("issues-error"), () => api("POST", `/staff/investigations/${enc(x.investigation)}/open`))) showIssue(r.issue);
          } }, "Open investigation")]
          : x.state ? ` (${x.state})` : null))));
    box.replaceChildren(el("p", { role: "status" }, `Research run ${run}: ${r.state}${r.reason ? ` — ${r.reason}` : ""}`),
      list("Sources to read", s.sources), list("Questions to ask", s.questions), list("Investigations", s.investigations));
    return;
  }
}

// --- reviews ---------------------------------------------------------------------------------

function me() {
  return (claims() || {}).sub;
}

/** What the queue says about who may review next (the second-reviewer rule, visible). */
function whoNext(item) {
  if (item.waiting_for !== "second_review") return "first review";
  const first = item.reviews[0] ? item.reviews[0].by : "another reviewer";
  return first === me()
    ? `second review — you gave the first (${first}); a different reviewer must give this one`
    : `second review — first given by ${first}`;
}

// The queue is read once (GET /staff/reviews/queue: what waits, as of a seq), then followed
// (GET /staff/reviews/stream after that seq): each event is a contribution's entry as it now
// stands, so applying it replaces the entry, or removes it once no reviewer is needed.
const waiting = new Map();
let queueStream = null;

function drawQueue() {
  const items = [...waiting.values()].sort((a, b) => a.submitted_at.localeCompare(b.submitted_at));
  $("review-queue").replaceChildren(...items.map((item) => el("li", {
    class: "queue-item", "data-contribution": item.contribution, "data-waiting-for": item.waiting_for,
  }, el("button", { type: "button", class: "link", onclick: () => openReview(item.contribution, item.waiting_for) }, item.contribution),
  ` on ${item.issue}`, el("span", { class: "badge" }, whoNext(item)),
  item.flag_count ? el("span", { class: "badge" }, `${item.flag_count} flagged: ${item.flag_kinds.join(", ")}`) : null)));
}

function applyQueueEvent(item) {
  if (item.waiting_for) waiting.set(item.contribution, item);
  else waiting.delete(item.contribution);
  drawQueue();
}

function queueStatus({ state, cursor, reconnects, message }) {
  const status = $("queue-status");
  status.textContent = message ? `${state}: ${message}` : state === "live" ? "live" : state;
  status.dataset.state = state;
  status.dataset.cursor = cursor;
  status.dataset.reconnects = reconnects;
  // Older than the edge keeps: what was missed is only in the queue as it stands, read it again.
  if (state === "gap") openQueue();
}

/** Read the queue once, then follow its stream from the seq it was read at. */
async function openQueue() {
  queueStream?.stop();
  queueStream = null;
  const queue = await attempt($("review-error"), () => api("GET", "/staff/reviews/queue"));
  if (!queue) return;
  waiting.clear();
  for (const item of queue.waiting) waiting.set(item.contribution, item);
  drawQueue();
  queueStream = follow("/staff/reviews/stream", {
    after: queue.last_seq, onStatus: queueStatus,
    onEvent: (event, data) => event === "queue" && applyQueueEvent(data),
  });
}

/** The text with every flagged span in a <mark> (spans sorted; overlaps merged into the first). */
function highlighted(text, flags) {
  const out = [];
  let at = 0;
  for (const f of [...(flags || [])].sort((a, b) => a.start - b.start)) {
    if (f.start < at) continue;
    out.push(text.slice(at, f.start),
      el("mark", { class: "flag", "data-testid": "flag", title: `${f.kind}: ${f.reason}` }, text.slice(f.start, f.end)));
    at = f.end;
  }
  out.push(text.slice(at));
  return out;
}

async function openReview(contribution, waitingFor) {
  const read = () => attempt($("review-error"), () => api("GET", `/staff/contributions/${enc(contribution)}`));
  let c = await read();
  // The queue's stream can run ahead of the contribution's own view (another projection of the
  // same review): read again, briefly, until the two agree on what the contribution waits for.
  for (let i = 0; c && waitingFor && c.waiting_for !== waitingFor && i < 10; i += 1) {
    await new Promise((resolve) => setTimeout(resolve, 300));
    c = await read();
  }
  if (!c) return;
  const box = $("review");
  box.hidden = false;
  box.dataset.contribution = contribution;
  const blocked = c.waiting_for === "second_review" && c.reviews.some((r) => r.by === me());
  const decide = (decision) => async () => {
    const accepted = await attempt($("review-error"), () => api("POST",
      `/staff/contributions/${enc(contribution)}/review`, { json: { decision }, headers: { "Idempotency-Key": `${contribution}-${decision}` } }));
    if (!accepted) return;
    box.replaceChildren(el("p", { role: "status", "data-testid": "review-done" },
      `Your ${accepted.command.replace("_", " ")} (${decision}) of ${contribution} is recorded.`));
    // The queue's stream brings the entry's new state (or its leaving): nothing to re-read.
  };
  box.replaceChildren(
    el("h3", {}, `Contribution ${contribution}`),
    el("p", { class: "meta" }, `By ${c.author} on ${c.issue}; waiting for ${c.waiting_for ? whoNext(c) : c.state}.`),
    el("blockquote", { "data-testid": "review-text" }, highlighted(c.text, c.flags)),
    c.flags && c.flags.length
      ? el("ul", { class: "list" }, c.flags.map((f) => el("li", {}, `${f.kind} (${f.source}): “${f.text}” — ${f.reason}`)))
      : el("p", {}, "Nothing flagged."),
    c.reviews.length ? el("p", {}, `Reviews so far: ${c.reviews.map((r) => `${r.by} ${r.decision}`).join("; ")}.`) : null,
    blocked ? el("p", { class: "error", "data-testid": "second-reviewer-rule" },
      "You gave the first review of this contribution: the second must come from a different reviewer.") : null,
    el("div", { class: "row" },
      el("button", { type: "button", "data-testid": "approve", disabled: blocked, onclick: decide("approve") }, "Approve"),
      el("button", { type: "button", class: "secondary", "data-testid": "redact", disabled: blocked, onclick: decide("redact") }, "Redact flagged spans"),
      el("button", { type: "button", class: "danger", "data-testid": "reject", disabled: blocked, onclick: decide("reject") }, "Reject")));
}

// --- workflows -------------------------------------------------------------------------------

async function showWorkflow(workflow) {
  const w = await attempt($("workflow-error"), () => api("GET", `/staff/workflows/${enc(workflow)}`));
  if (!w) return;
  const box = $("workflow");
  box.hidden = false;
  box.replaceChildren(
    el("p", {}, el("strong", {}, `${w.kind} ${w.workflow}`), el("span", { class: "badge", "data-status": w.status }, w.status)),
    w.step ? el("p", {}, `Step: ${w.step}${w.waiting_for ? `, waiting for ${w.waiting_for}` : ""}`) : null,
    w.last_error ? el("p", { class: "error" }, `Last error: ${w.last_error}`) : null,
    w.status === "failed"
      ? el("button", { type: "button", onclick: async () => {
        if (await attempt($("workflow-error"), () => api("POST", `/staff/workflows/${enc(w.workflow)}/retry`))) {
          setTimeout(() => { showWorkflow(w.workflow); loadFailed(); }, 1000);
        }
      } }, "Retry from the failed step")
      : null,
    el("details", {}, el("summary", {}, `${w.records.length} records`),
      el("ol", { class: "list" }, w.records.map((r) => el("li", {}, `${r.type} ${when(r.time)}`)))));
}

/** The tenant's failed workflows (GET /staff/workflows?status=failed), each to open or retry. */
async function loadFailed() {
  const failed = await attempt($("workflow-error"), () => api("GET", "/staff/workflows?status=failed"));
  if (!failed) return;
  $("failed-workflows").replaceChildren(...(failed.length ? failed.map((w) => el("li", { "data-workflow": w.workflow },
    el("button", { type: "button", class: "link", onclick: () => showWorkflow(w.workflow) }, `${w.kind} ${w.workflow}`),
    el("span", { class: "meta" }, ` failed${w.step ? ` at ${w.step}` : ""}${w.updated_at ? `, ${when(w.updated_at)}` : ""}`
      + (w.last_error ? ` — ${w.last_error}` : ""))))
    : [el("li", { class: "meta" }, "No failed workflow.")]));
}

function start() {
  $("signin").hidden = true;
  $("app").hidden = false;
  renderAccount($("account"));
  $("open-issue-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { title: $("issue-title").value.trim(), summary: $("issue-summary").value.trim() };
    const made = await attempt($("issues-error"), () => api("POST", "/staff/issues", { json: body }));
    if (!made) return;
    e.target.reset();
    showIssue(made.issue);
    loadIssues();
  });
  $("find-issue-form").addEventListener("submit", (e) => { e.preventDefault(); showIssue($("issue-id").value.trim()); });
  $("workflow-form").addEventListener("submit", (e) => { e.preventDefault(); showWorkflow($("workflow-id").value.trim()); });
  $("refresh-queue").addEventListener("click", openQueue);
  $("more-issues").addEventListener("click", () => loadIssues(true));
  $("refresh-failed").addEventListener("click", loadFailed);
  const role = (claims() || {}).role;
  // What each role may read (streams/capabilities.py): issues.read, workflows.read.
  if (["staff", "representative"].includes(role)) loadIssues();
  else $("issue-list-title").hidden = true;
  if (["staff", "operator"].includes(role)) loadFailed();
  if (["staff", "reviewer"].includes(role)) openQueue();
}

takeTokenFromFragment();
if (renderAccount($("account"))) start();
else {
  $("signin").hidden = false;
  renderSignIn($("signin"), { role: "reviewer", done: () => location.reload() });
}
