"""Deterministic answering rules of the model simulator (see ``deploy/simulator.py``).

The agent is named by a ``[agent: NAME]`` line in the system prompt; each rule reads the
conversation (Messages API shape) and returns content blocks. ``tool_use`` blocks come back
without an ``id``; the simulator assigns ``toolu_sim_…`` ids. Only the user text message that
opened the current turn (the last user message with text and no ``tool_result``) and the tool
results after it are considered; ``[CURRENT_STATE]`` text blocks are context, not the user's words.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any

STATE_MARKER = "[CURRENT_STATE]"
_AGENT = re.compile(r"\[agent:\s*([\w.-]+)\s*\]", re.I)
_CONCERN = re.compile(r"\b(worr(?:y|ied|ies|ying)|concern\w*|problem\w*|issue\w*|unsafe|broken|too|"
                      r"can['’]t|cannot|not enough|lack\w*|dangerous|noisy|dirty|late|expensive|"
                      r"afraid)\b", re.I)
_ASK = re.compile(r"\b(please|should|we need|wants?|could you|fix|add|build|stop)\b", re.I)
_STOP = set("""
a an the and or but so if then than that this these those there here it its is are was were
be been being am i me my we our us you your they them their he she his her of to in on at for
from by with about into over under as not no yes very really just also too can't cannot can could
would should will shall do does did done have has had get got make made please want wants need
needs some any all more most many much lot lots thing things what when where which who why how
worried worry concern concerned concerns afraid think feel still even again every because
while""".split())
STATES = {
    "AL": "Alabama", "AK": "Alaska", "AZ": "Arizona", "AR": "Arkansas", "CA": "California",
    "CO": "Colorado", "CT": "Connecticut", "DE": "Delaware", "DC": "District of Columbia",
    "FL": "Florida", "GA": "Georgia", "HI": "Hawaii", "ID": "Idaho", "IL": "Illinois",
    "IN": "Indiana", "IA": "Iowa", "KS": "Kansas", "KY": "Kentucky", "LA": "Louisiana",
    "ME": "Maine", "MD": "Maryland", "MA": "Massachusetts", "MI": "Michigan", "MN": "Minnesota",
    "MS": "Mississippi", "MO": "Missouri", "MT": "Montana", "NE": "Nebraska", "NV": "Nevada",
    "NH": "New Hampshire", "NJ": "New Jersey", "NM": "New Mexico", "NY": "New York",
    "NC": "North Carolina", "ND": "North Dakota", "OH": "Ohio", "OK": "Oklahoma", "OR": "Oregon",
    "PA": "Pennsylvania", "RI": "Rhode Island", "SC": "South Carolina", "SD": "South Dakota",
    "TN": "Tennessee", "TX": "Texas", "UT": "Utah", "VT": "Vermont", "VA": "Virginia",
    "WA": "Washington", "WV": "West Virginia", "WI": "Wisconsin", "WY": "Wyoming",
}
_NOT_NAMES = set("""
The This That These Those A An I We They He She It My Our Your Their Hi Hello Dear
Thanks Thank Please Mr Mrs Ms Dr Prof Mayor Councillor Councilor Officer Sir Madam Yesterday Today
Tomorrow Also And But So Then When If Last Next Every Some Many Most All New North South East West
Street St Road Rd Avenue Ave Lane Park City County Council Hall School Church Station Center Centre
Library Hospital Department University Monday Tuesday Wednesday Thursday Friday Saturday Sunday
January February March April May June July August September October November December""".split())


@dataclass
class Conversation:
    """The parts of a Messages API request the rules look at."""

    system: str
    agent: str | None
    tools: list[str]
    user_texts: list[str]          # every user text block (state blocks included), oldest first
    text: str                      # the user's own words that opened this turn
    state: str                     # [CURRENT_STATE] text of that message, if any
    calls: list[dict] = field(default_factory=list)   # this turn: {name, input, result, data}
    images: list[dict] = field(default_factory=list)  # every user image: {media_type, bytes}

    def results(self, name: str) -> list[dict]:
        return [c for c in self.calls if c["name"] == name and c["result"] is not None]


def block_text(content: Any) -> str:
    """Plain text of a message/tool_result content (str or list of blocks)."""
    if isinstance(content, str):
        return content
    parts = []
    for b in content or []:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "text":
            parts.append(b.get("text", ""))
        elif b.get("type") == "tool_use":
            parts.append(json.dumps(b.get("input", {})))
        elif b.get("type") == "tool_result":
            parts.append(block_text(b.get("content", "")))
    return "\n".join(parts)


def _blocks(content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        m = re.search(r"```(?:json)?\s*(.*?)```", text or "", re.S)
        if m:
            try:
                return json.loads(m.group(1))
            except ValueError:
                return None
    return None


def parse(body: dict) -> Conversation:
    system = block_text(body.get("system") or "")
    agent = _AGENT.search(system)
    tools = [t.get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)]
    if (body.get("tool_choice") or {}).get("type") == "none":
        tools = []
    messages = [x for x in body.get("messages") or [] if isinstance(x, dict)]
    anchor, user_texts = -1, []
    for i, msg in enumerate(messages):
        blocks = _blocks(msg.get("content"))
        if msg.get("role") != "user":
            continue
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        user_texts.extend(texts)
        own = [t for t in texts if not t.lstrip().startswith(STATE_MARKER)]
        if own and not any(b.get("type") == "tool_result" for b in blocks):
            anchor = i
    text = state = ""
    if anchor >= 0:
        texts = [b.get("text", "") for b in _blocks(messages[anchor].get("content"))
                 if b.get("type") == "text"]
        text = "\n".join(t for t in texts if not t.lstrip().startswith(STATE_MARKER))
        state = "\n".join(t for t in texts if t.lstrip().startswith(STATE_MARKER))
    calls, by_id = [], {}
    for msg in messages[anchor + 1:]:
        for b in _blocks(msg.get("content")):
            if b.get("type") == "tool_use":
                call = {"name": b.get("name"), "input": b.get("input") or {}, "result": None,
                        "data": None}
                by_id[b.get("id")] = call
                calls.append(call)
            elif b.get("type") == "tool_result":
                call = by_id.get(b.get("tool_use_id"))
                if call is None:
                    call = {"name": None, "input": {}, "result": None, "data": None}
                    calls.append(call)
                call["result"] = block_text(b.get("content", ""))
                call["error"] = bool(b.get("is_error"))
                call["data"] = _json(call["result"])
    name = agent.group(1).lower() if agent else None
    images = [{"media_type": b["source"].get("media_type"),
               "bytes": len(base64.b64decode(b["source"].get("data") or ""))}
              for m in messages if m.get("role") == "user" for b in _blocks(m.get("content"))
              if b.get("type") == "image" and isinstance(b.get("source"), dict)]
    return Conversation(system, name, tools, user_texts, text.strip(), state, calls, images)


IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def image_problem(body: dict) -> str | None:
    """What is wrong with the request's ``image`` blocks, as the Messages API would say it
    (``messages.0.content.1.image.source.…``); ``None`` when they are all well formed."""
    for i, msg in enumerate(body.get("messages") or []):
        content = msg.get("content") if isinstance(msg, dict) else None
        for j, b in enumerate(content if isinstance(content, list) else []):
            if not (isinstance(b, dict) and b.get("type") == "image"):
                continue
            where, src = f"messages.{i}.content.{j}.image.source", b.get("source")
            if msg.get("role") != "user":
                return f"messages.{i}.content.{j}: image blocks are only allowed in user messages"
            if not isinstance(src, dict) or src.get("type") != "base64":
                kind = src.get("type") if isinstance(src, dict) else None
                return f"{where}.type: Input should be 'base64' (got {kind!r})"
            if src.get("media_type") not in IMAGE_MEDIA_TYPES:
                return (f"{where}.base64.media_type: Input should be "
                        + ", ".join(repr(t) for t in IMAGE_MEDIA_TYPES))
            try:
                raw = base64.b64decode(src.get("data") or "", validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if not raw:
                return f"{where}.base64.data: the image data is not valid base64"
    return None


def answer(body: dict) -> list[dict]:
    """Content blocks the simulated model replies with."""
    conv = parse(body)
    rule = RULES.get(conv.agent or "", generic)
    return rule(conv)


def _text(s: str) -> dict:
    return {"type": "text", "text": s}


def _tool(name: str, inp: dict) -> dict:
    return {"type": "tool_use", "name": name, "input": inp}


def _fenced(obj: Any) -> str:
    return "```json\n" + json.dumps(obj, indent=2, ensure_ascii=False) + "\n```"


def generic(conv: Conversation) -> list[dict]:
    said = conv.text or "(nothing)"
    return [_text(f"Echo: {said}")]


# ---------------------------------------------------------------- concern extraction
def keywords(text: str) -> list[str]:
    out: list[str] = []
    for w in re.findall(r"[a-z][a-z'’-]*", text.lower()):
        w = w.strip("'’-")
        if len(w) >= 3 and w not in _STOP and w not in out:
            out.append(w)
    return out


def _stems(words: list[str]) -> set[str]:
    return {w[:-1] if w.endswith("s") and len(w) > 3 else w for w in words}


def _gibberish_word(w: str) -> bool:
    lw = w.lower()
    if len(lw) < 4:
        return False
    return (not re.search(r"[aeiouy]", lw) or bool(re.search(r"[^aeiouy]{5,}", lw))
            or bool(re.search(r"(.)\1{3,}", lw)))


def uninterpretable(text: str) -> str | None:
    """Why ``text`` cannot be read as concerns, or None when it can."""
    if "[uninterpretable]" in text:
        return "the message was marked [uninterpretable]"
    words = re.findall(r"[A-Za-z][A-Za-z'’-]*", text)
    if not text.strip():
        return "the message is empty"
    if len(words) < 3:
        return f"the message has fewer than 3 words ({len(words)})"
    if sum(_gibberish_word(w) for w in words) * 2 > len(words):
        return "the message looks like gibberish"
    return None


def extract_concerns(text: str) -> list[dict]:
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
    quotes = [s for s in sentences if _CONCERN.search(s)] or [text.strip()]
    out = []
    for q in quotes:
        st = q.rstrip(" .!?")
        out.append({"statement": st[:1].upper() + st[1:], "quote": q})
    return out


def _title(statement: str) -> str:
    if len(statement) <= 80:
        return statement
    cut = statement[:80].rsplit(" ", 1)[0]
    return cut if len(cut) >= 20 else statement[:80]


def _records(data: Any, raw: str) -> list[dict]:
    """Records with an ``id`` in a tool result (JSON walk, or line-wise text fallback)."""
    found: list[dict] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if isinstance(x.get("id"), (str, int)):
                found.append(x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    if data is not None:
        walk(data)
        return found
    for line in (raw or "").splitlines():
        m = re.search(r"\"id\"\s*:\s*\"([^\"]+)\"|\b(iss-[0-9a-f]+)\b", line)
        if m:
            found.append({"id": m.group(1) or m.group(2), "title": line})
    return found


def _related(searches: list[dict], first_kw: list[str]) -> str | None:
    """The issue a concern relates to, from its searches' results. A result that grades its
    rows (``strong``, as Voice's catalog does) is trusted: its first strong row, else none.
    Ungraded rows: the one whose title shares most words with the concern."""
    relates, best = None, 0
    for call in searches:
        if call.get("error"):
            continue
        records = _records(call["data"], call["result"])
        graded = [r for r in records if isinstance(r.get("strong"), bool)]
        if graded:
            strong = [r for r in graded if r["strong"]]
            if strong:
                return str(strong[0]["id"])
            continue
        for rec in records:
            title = str(rec.get("title") or rec.get("name") or rec.get("summary") or "")
            overlap = len(_stems(keywords(title)) & _stems(first_kw))
            if overlap > best:
                relates, best = str(rec["id"]), overlap
    return relates


def concern_extraction(conv: Conversation) -> list[dict]:
    reason = uninterpretable(conv.text)
    if reason:
        # Quoting the message, as real models do: the reason then carries the participant's
        # words, which Voice must seal like the message itself (issue 12 §5).
        quote = " ".join(conv.text.split())[:80]
        return [_text(f"COULD_NOT_INTERPRET: {reason}: \"{quote}\".")]
    concerns = extract_concerns(conv.text)
    first_kw = keywords(concerns[0]["statement"])
    asks = bool(_ASK.search(conv.text))
    searches = conv.results("search_issues")
    if asks and "search_issues" in conv.tools and not searches:
        return [_tool("search_issues", {"query": " ".join(first_kw[:8]) or conv.text[:80]})]
    relates = _related(searches, first_kw)
    new_issue = None
    if asks and relates is None:
        new_issue = {"title": _title(concerns[0]["statement"]),
                     "summary": " ".join(c["statement"].rstrip(".") + "." for c in concerns)}
    n = len(concerns)
    lines = [f"I heard {n} concern{'s' if n != 1 else ''}:"]
    lines += [f"- {c['statement']}" for c in concerns]
    if relates:
        lines.append(f"This relates to the existing issue {relates}.")
    elif new_issue:
        lines.append(f"I suggest raising a new issue: \"{new_issue['title']}\".")
    result = {"concerns": concerns, "relates_to_issue": relates, "new_issue": new_issue}
    return [_text("\n".join(lines) + "\n\n" + _fenced(result))]


# ---------------------------------------------------------------- assistant (map example)
def _find_state(text: str) -> str | None:
    if re.search(r"\bWashington,?\s*D\.?\s?C\b|\bDistrict of Columbia\b", text, re.I):
        return "DC"
    for code, name in sorted(STATES.items(), key=lambda kv: -len(kv[1])):
        if re.search(rf"\b{re.escape(name)}\b", text, re.I):
            return code
    return None


def _dataset_id(conv: Conversation) -> str | None:
    pats = [r"\bID:\s*([0-9a-fA-F][0-9a-fA-F-]{3,})\b",
            r"dataset_id[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9_-]+)"]
    for text in [conv.text, conv.state, *reversed(conv.user_texts), conv.system]:
        for pat in pats:
            m = re.search(pat, text or "")
            if m:
                return m.group(1)
    return None


def _find_key(data: Any, key: str) -> Any:
    if isinstance(data, dict):
        if key in data:
            return data[key]
        for v in data.values():
            hit = _find_key(v, key)
            if hit is not None:
                return hit
    elif isinstance(data, list):
        for v in data:
            hit = _find_key(v, key)
            if hit is not None:
                return hit
    return None


def _state_column(describe: Any) -> tuple[str | None, bool]:
    """(column name, values are full state names) from a describe_dataset result."""
    cols = _find_key(describe, "columns") or []
    named = [(c if isinstance(c, dict) else {"name": c}) for c in cols]
    named = [c for c in named if isinstance(c.get("name"), str)]
    exact = ("state", "st", "state_code", "state_abbr", "state_abbrev", "stusps", "state_name")
    pick = next((c for e in exact for c in named if c["name"].lower() == e), None)
    pick = pick or next((c for c in named if "state" in c["name"].lower()), None)
    if pick is None:
        return None, False
    name = pick["name"]
    samples: list[Any] = []
    for k in ("sample_values", "samples", "sample", "examples", "values", "top_values"):
        v = pick.get(k)
        samples += v if isinstance(v, list) else [v] if v is not None else []
    rows = _find_key(describe, "sample_rows") or _find_key(describe, "rows") or []
    samples += [r.get(name) for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    strs = [s for s in samples if isinstance(s, str)]
    full = any(len(s) > 2 for s in strs) if strs else name.lower() == "state_name"
    return name, full


def _row_count(data: Any) -> int | None:
    if isinstance(data, list):
        return len(data)
    for k in ("row_count", "rows_count", "total_rows", "num_rows", "n_rows", "count"):
        v = _find_key(data, k)
        if isinstance(v, int):
            return v
    for k in ("rows", "data", "records"):
        v = _find_key(data, k)
        if isinstance(v, list):
            return len(v)
    return None


_STOP_EARLY = re.compile(r"\bstop early\b", re.I)


def agentic(conv: Conversation) -> list[dict]:
    """An agentic turn (the ``plan`` tool is offered): plan, look at the dataset if one is
    attached, mark the steps done, answer. Asked to "stop early", it leaves the last step
    undone, so the end-of-turn plan guardrail has something to report."""
    dataset = _dataset_id(conv)
    steps = (["Look at the dataset", "Answer the question"] if dataset
             else ["Answer the question"])
    plans = conv.results("plan")
    if not plans:
        return [_text("First, a plan."),
                _tool("plan", {"steps": [{"title": s, "done": False} for s in steps]})]
    if dataset and "describe_dataset" in conv.tools and not conv.results("describe_dataset"):
        return [_tool("describe_dataset", {"dataset_id": dataset})]
    finished = len(steps) - 1 if _STOP_EARLY.search(conv.text) else len(steps)
    if len(plans) == 1:
        return [_tool("plan", {"steps": [{"title": s, "done": i < finished}
                                         for i, s in enumerate(steps)]})]
    if finished < len(steps):
        return [_text(f"I stopped early: {finished} of {len(steps)} steps are done.")]
    return [_text(f"Done: all {len(steps)} steps of the plan are finished.")]


def assistant(conv: Conversation) -> list[dict]:
    map_tools = {"describe_dataset", "query_dataset", "display_map"}
    wants_map = re.search(r"\bmaps?\b", conv.text, re.I) and map_tools <= set(conv.tools)
    if "plan" in conv.tools and not wants_map:
        return agentic(conv)
    if not wants_map:
        said = conv.text or "(nothing)"
        seen = ""
        if conv.images:
            seen = (f" I can see {len(conv.images)} image(s) in this conversation: "
                    + ", ".join(f"{i['media_type']} of {i['bytes']} bytes" for i in conv.images)
                    + ".")
        return [_text(f"Happy to help. You said: \u201c{said[:300]}\u201d.{seen} "
                      "(This reply comes from the Voice model simulator.)")]
    dataset = _dataset_id(conv)
    if dataset is None:
        return [_text("Which dataset should I map? I could not find a dataset id (ID: …).")]
    code = _find_state(conv.text)
    place = STATES[code] if code else "the dataset"
    shown, queried, described = (conv.results("display_map"), conv.results("query_dataset"),
                                 conv.results("describe_dataset"))
    if shown:
        n = _row_count(queried[-1]["data"]) if queried else None
        rows = f"{n} matching row{'s' if n != 1 else ''}" if n is not None else "the matching rows"
        return [_text(f"The map of {place} is displayed, showing {rows} from dataset {dataset}.")]
    if queried:
        sql = queried[-1]["input"].get("sql", "SELECT * FROM data")
        return [_text("Now I'll draw the map."),
                _tool("display_map", {"dataset_id": dataset, "sql": sql,
                                      "title": f"Map of {place}"})]
    if described:
        col, full = _state_column(described[-1]["data"])
        sql = "SELECT * FROM data"
        if col and code:
            sql += f" WHERE {col} = '{STATES[code] if full else code}'"
        return [_text("Let me query the matching rows."),
                _tool("query_dataset", {"dataset_id": dataset, "sql": sql})]
    return [_text("Let me look at the dataset first."),
            _tool("describe_dataset", {"dataset_id": dataset})]


# ---------------------------------------------------------------- compaction, privacy, research
def compaction(conv: Conversation) -> list[dict]:
    return [_text("Summary: " + "\n".join(t[:200] for t in conv.user_texts))]


def find_names(text: str) -> list[dict]:
    words = [(m.group(0), m.start(), m.end())
             for m in re.finditer(r"\b[A-Z][a-z]+(?:[-'’][A-Z]?[a-z]+)?\b", text)]
    flags, i = [], 0
    while i + 1 < len(words):
        (w1, s1, e1), (w2, s2, e2) = words[i], words[i + 1]
        if text[e1:s2] == " " and w1 not in _NOT_NAMES and w2 not in _NOT_NAMES:
            flags.append({"start": s1, "end": e2, "kind": "person_name",
                          "reason": f"\u201c{text[s1:e2]}\u201d looks like a person's name"})
            i += 2
        else:
            i += 1
    return flags


def privacy_flagging(conv: Conversation) -> list[dict]:
    flags = find_names(conv.text)
    return [_text(f"I found {len(flags)} possible personal name(s).\n\n"
                  + _fenced({"flags": flags}))]


def research_assistant(conv: Conversation) -> list[dict]:
    done = [c for c in conv.calls if c["result"] is not None]
    if conv.tools and not done:
        tool = next((t for t in conv.tools if t.startswith(("get_", "list_"))), None)
        if tool:
            m = re.search(r"\biss-[0-9a-f]+\b", "\n".join([*conv.user_texts, conv.system]))
            return [_tool(tool, {"issue": m.group(0)} if m else {})]
    reads: list[str] = []
    sources = []
    for c in done:
        ids = [str(r["id"]) for r in _records(c["data"], c["result"])]
        reads += [i for i in ids if i not in reads]
        sources.append({"title": f"Records from {c['name']}",
                        "reason": f"{len(ids)} record(s) returned by {c['name']}", "read": ids})
    result = {
        "sources": sources,
        "questions": [{"title": "What outcome matters most to the people who raised this?",
                       "reason": "Clarifies priorities before acting", "read": reads}],
        "investigations": [{"title": f"Look for patterns across {len(reads)} record(s)",
                            "reason": "Recurring themes suggest a shared cause", "read": reads}],
    }
    return [_text(f"I reviewed {len(reads)} record(s).\n\n" + _fenced(result))]


RULES = {
    "concern-extraction": concern_extraction,
    "assistant": assistant,
    "compaction": compaction,
    "privacy-flagging": privacy_flagging,
    "research-assistant": research_assistant,
}
