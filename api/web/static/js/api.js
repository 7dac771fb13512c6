// The one API client of the pages. The bearer comes from the URL fragment (#token=…) once, is
// kept in sessionStorage and sent only in the Authorization header: never in a URL requested,
// so it never reaches a log, a proxy or a Referer. Every failure becomes an ApiError whose
// message says, in words, what happened and what to do.

const TOKEN_KEY = "voice.token";

/** Move a token from the fragment into sessionStorage and drop it from the address bar. */
export function takeTokenFromFragment() {
  const match = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!match) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
  history.replaceState(null, "", location.pathname + location.search);
}

export const currentToken = () => sessionStorage.getItem(TOKEN_KEY);
export const setToken = (token) => sessionStorage.setItem(TOKEN_KEY, token.trim());
export const signOut = () => sessionStorage.removeItem(TOKEN_KEY);

/** The token's claims, for display only (the edge verifies; this never trusts them). */
export function claims() {
  const token = currentToken();
  if (!token) return null;
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part.padEnd(part.length + ((4 - (part.length % 4)) % 4), "=")));
  } catch {
    return null;
  }
}

const WORDS = {
  0: "The server could not be reached. Check the connection and retry.",
  400: "The request was not understood.",
  401: "You are not signed in, or your sign-in has expired. Sign in again.",
  403: "You are not allowed to do this with your current role.",
  404: "Not found: it does not exist, was erased, or is not yours.",
  409: "This conflicts with the current state.",
  413: "That is too large.",
  415: "That kind of file is not accepted.",
  422: "Some input was not accepted.",
  429: "Too many requests for now.",
  500: "Something went wrong on the server.",
  503: "The service is briefly unavailable.",
};

/** An API failure: ``status`` (0: no answer), a message in words, and when to retry. */
export class ApiError extends Error {
  constructor(status, message, retryAfterS = null, body = null) {
    super(message);
    this.status = status;
    this.retryAfterS = retryAfterS;
    this.body = body;
  }

  /** Whether trying the same thing again later may work. */
  get retryable() {
    return [0, 429, 500, 503].includes(this.status);
  }
}

function detailText(detail) {
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail.map((d) => {
      const where = (d.loc || []).filter((p) => p !== "body").join(".");
      return where ? `${where}: ${d.msg}` : d.msg;
    }).join("; ");
  }
  return "";
}

/** The words for an error answer ``status`` with JSON ``body``. */
export function describe(status, body, retryAfterS) {
  const base = WORDS[status] || `The server answered ${status}.`;
  const detail = body ? detailText(body.detail) : "";
  const wait = retryAfterS ? ` Retry in ${retryAfterS} s.` : "";
  return detail ? `${base} (${detail})${wait}` : `${base}${wait}`;
}

export function authHeaders(extra = {}) {
  const token = currentToken();
  return token ? { ...extra, Authorization: `Bearer ${token}` } : { ...extra };
}

/** Call the API: ``json`` or ``form`` as the body; resolves to the parsed JSON (null: 204). */
export async function api(method, path, options = {}) {
  return (await request(method, path, options)).body;
}

/** A GET of a list that comes a page at a time: its items, and the URL of the page after it
 *  (the `Link` header's `rel="next"`), or null on the last page. */
export async function apiPage(path, options = {}) {
  const { body, response } = await request("GET", path, options);
  const link = response.headers.get("Link") || "";
  const next = /<([^>]*)>\s*;\s*rel="next"/.exec(link);
  return { items: body, next: next ? next[1] : null };
}

async function request(method, path, { json, form, headers, signal } = {}) {
  const init = { method, headers: authHeaders({ Accept: "application/json", ...headers }), signal };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (form !== undefined) {
    init.body = form;
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, WORDS[0]);
  }
  const text = response.status === 204 ? "" : await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const retryAfter = Number(response.headers.get("Retry-After")) || null;
    throw new ApiError(response.status, describe(response.status, body, retryAfter), retryAfter, body);
  }
  return { body, response };
}
