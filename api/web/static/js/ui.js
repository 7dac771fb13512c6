// What every page shares: building elements, showing errors in words (with a retry where it
// makes sense), and the sign-in panel (paste a token; in dev on a loopback edge, a form that
// mints one through /dev/token).

import { api, ApiError, claims, currentToken, setToken, signOut } from "./api.js";

/** An element with attributes (``on…`` functions become listeners) and children. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Show ``error`` in ``box`` (role=alert); a Retry button calls ``retry`` when it may help. */
export function showError(box, error, retry = null) {
  box.replaceChildren();
  if (!error) {
    box.hidden = true;
    return;
  }
  if (error.name === "AbortError") return;
  box.hidden = false;
  const message = error instanceof ApiError ? error.message : `Unexpected problem: ${error.message}`;
  box.append(el("span", {}, message));
  if (retry && (!(error instanceof ApiError) || error.retryable || error.status === 409)) {
    box.append(" ", el("button", { type: "button", onclick: () => { showError(box, null); retry(); } }, "Retry"));
  }
  if (error instanceof ApiError && error.status === 401) {
    box.append(" ", el("button", { type: "button", onclick: () => { signOut(); location.reload(); } }, "Sign in again"));
  }
}

/** Run ``action``; on failure show its error in ``box`` with a retry of the same action. */
export async function attempt(box, action) {
  showError(box, null);
  try {
    return await action();
  } catch (error) {
    console.info("voice:", error.message);
    showError(box, error, () => attempt(box, action));
    return undefined;
  }
}

/** Fill the header's account line; returns true when a token is present. */
export function renderAccount(slot) {
  const who = claims();
  slot.replaceChildren();
  if (!currentToken()) return false;
  slot.append(
    el("span", { "data-testid": "signed-in-as" }, who ? `${who.sub} (${who.role}${who.tenant ? `, ${who.tenant}` : ""})` : "signed in"),
    " ",
    el("button", { type: "button", onclick: () => { signOut(); location.reload(); } }, "Sign out"),
  );
  return true;
}

/** The sign-in panel in ``panel``; calls ``done()`` once a token is kept. */
export async function renderSignIn(panel, { role = "participant", done }) {
  const error = el("p", { class: "error", role: "alert", hidden: true });
  const pasted = el("textarea", { id: "token-input", rows: 3, required: true, autocomplete: "off", spellcheck: "false" });
  const pasteForm = el("form", {
    onsubmit: (event) => {
      event.preventDefault();
      setToken(pasted.value);
      done();
    },
  }, el("label", { for: "token-input" }, "Bearer token"), pasted,
  el("button", { type: "submit" }, "Use this token"));
  panel.replaceChildren(el("h2", {}, "Sign in"),
    el("p", {}, "Open this page with #token=… in its address, or paste a token."), pasteForm, error);
  let config = { dev_signin: false };
  try {
    config = await api("GET", "/web/config");
  } catch (e) {
    showError(error, e);
  }
  if (!config.dev_signin) return;
  const sub = el("input", { id: "dev-sub", required: true, value: role === "participant" ? "alice" : `${role}-1`, autocomplete: "username" });
  const roles = ["participant", "staff", "reviewer", "representative", "operator", "analyst"];
  const roleSelect = el("select", { id: "dev-role" }, roles.map((r) => el("option", { value: r, selected: r === role }, r)));
  const tenant = el("input", { id: "dev-tenant", required: true, value: "default" });
  const devForm = el("form", {
    "data-testid": "dev-signin",
    onsubmit: async (event) => {
      event.preventDefault();
      const minted = await attempt(error, () => api("POST", "/dev/token", {
        json: { sub: sub.value.trim(), role: roleSelect.value, tenant: tenant.value.trim() },
      }));
      if (minted) {
        setToken(minted.token);
        done();
      }
    },
  }, el("h3", {}, "Dev sign-in (this edge runs in dev on a loopback address)"),
  el("label", { for: "dev-sub" }, "Name"), sub,
  el("label", { for: "dev-role" }, "Role"), roleSelect,
  el("label", { for: "dev-tenant" }, "Tenant"), tenant,
  el("button", { type: "submit", "data-testid": "dev-signin-button" }, "Sign in"));
  panel.insertBefore(devForm, error);
}

/** A short, readable time from an ISO timestamp (or nothing). */
export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? "" : d.toLocaleTimeString();
}
