"""Deterministic privacy detectors: the first half of a contribution's disclosure review.

Each detector finds spans of one kind of personal data in a text and checks what a pattern
alone cannot (Luhn for card numbers, mod-97 for IBANs, octet ranges for IP addresses, reserved
SSN areas), so that ordinary numbers are not flagged. A date is flagged only when the words
before it say it is a birth date. Reasons never quote the text: flags are stored beside it,
and the reviewer sees the span.

Nothing here does I/O or calls a model; the privacy-flagging agent runs after these.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Literal

Source = Literal["detector", "agent"]


@dataclass(frozen=True, order=True)
class Flag:
    """A span ``text[start:end]`` that may disclose personal data."""

    start: int
    end: int
    kind: str
    source: Source
    reason: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


Detector = Callable[[str], Iterator[tuple[int, int]]]

# --- patterns ------------------------------------------------------------------------------

_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
                    r"\.[A-Za-z]{2,}\b")
_URL = re.compile(r"\bhttps?://[^\s<>\"')\]]+", re.I)
_SOCIAL = re.compile(r"^(?:www\.|m\.)?(?:twitter\.com|x\.com|facebook\.com|fb\.com|"
                     r"instagram\.com|linkedin\.com|tiktok\.com|github\.com|youtube\.com|"
                     r"reddit\.com|threads\.net|bsky\.app|medium\.com|[\w.-]*mastodon[\w.-]*)$",
                     re.I)
_SOCIAL_NON_PROFILE = {"search", "hashtag", "explore", "watch", "help", "about", "policies",
                       "privacy", "terms", "login", "signup", "home", "settings", "share",
                       "intent", "events", "groups", "pages", "r"}
_SSN = re.compile(r"\b(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}\b")
_NINO = re.compile(r"\b(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]"
                   r" ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
_VERSION_BEFORE = re.compile(r"\b(?:version|ver\.?|v)\s*$", re.I)
_IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
_PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,5}\)[ .-]?)?\d{2,5}"
                    r"(?:[ .-]?\d{2,5}){1,4}(?![\w])")
_STREET = re.compile(
    r"\b\d{1,5}[A-Za-z]?,?\s+(?:[A-Z][a-z']+\s+){1,3}(?:Street|St|Road|Rd|Avenue|Ave|Lane|Ln|"
    r"Drive|Dr|Boulevard|Blvd|Court|Ct|Way|Place|Pl|Terrace|Close|Crescent|Gardens|Square|Sq|"
    r"Parkway|Pkwy|Highway|Hwy|Row|Mews|Grove|Hill)\b\.?"
    r"(?:,?\s+(?:Apt|Apartment|Flat|Unit|Suite)\.?\s*#?\w+)?")
_UK_POSTCODE = re.compile(r"\b(?:[A-Z]{1,2}\d[A-Z\d]?|GIR) ?\d[ABD-HJLNP-UW-Z]{2}\b")
_US_ZIP = re.compile(r"\b(?:A[KLRZ]|C[AOT]|D[CE]|FL|GA|HI|I[ADLN]|K[SY]|LA|M[ADEINOST]|"
                     r"N[CDEHJMVY]|O[HKR]|PA|RI|S[CD]|T[NX]|UT|V[AT]|W[AIVY]),?\s+\d{5}"
                     r"(?:-\d{4})?\b")
_MONTHS = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
           r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_DATE = (r"(?:\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}|\d{4}-\d{2}-\d{2}|"
         rf"\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTHS}\.?,?\s+\d{{4}}|"
         rf"{_MONTHS}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}})")
_DOB = re.compile(rf"\b(?:born(?:\s+on)?|d\.?o\.?b\.?|date\s+of\s+birth|birth\s*date|"
                  rf"birthday(?:\s+is)?)\s*(?:[:=-]|is|was)?\s*(?P<date>{_DATE})", re.I)
_DATE_ONLY = re.compile(rf"^{_DATE}$", re.I)


# --- checks ----------------------------------------------------------------------------------


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum of a card number (digits only)."""
    if not digits.isdigit() or len(digits) < 2:
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_valid(iban: str) -> bool:
    """ISO 13616 mod-97 check of an IBAN (spaces ignored)."""
    s = iban.replace(" ", "").upper()
    if not re.fullmatch(r"[A-Z]{2}\d{2}[A-Z0-9]{11,30}", s):
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _card(text: str) -> Iterator[tuple[int, int]]:
    for m in _CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group(0))
        # Issuer prefixes (Visa, Mastercard, Amex, Discover, JCB, Diners, UnionPay, Maestro)
        # on top of Luhn: one random number in ten passes Luhn alone.
        if 13 <= len(digits) <= 19 and digits[0] in "3456" and luhn_valid(digits):
            yield m.span()


def _iban(text: str) -> Iterator[tuple[int, int]]:
    for m in _IBAN.finditer(text):
        candidate = m.group(0)
        # The pattern may swallow a following word; shrink until the checksum holds.
        while len(candidate.replace(" ", "")) >= 15:
            if iban_valid(candidate):
                yield m.start(), m.start() + len(candidate)
                break
            candidate = candidate[:-1].rstrip()


def _ip(text: str) -> Iterator[tuple[int, int]]:
    for m in _IPV4.finditer(text):
        try:
            addr = ipaddress.IPv4Address(m.group(0))
        except ValueError:
            continue
        # "version 1.2.3.4" is a version number, not a host.
        if not addr.is_unspecified and not _VERSION_BEFORE.search(text[:m.start()]):
            yield m.span()
    for m in _IPV6.finditer(text):
        token = m.group(0)
        if token.count(":") < 2 or not re.search(r"[0-9A-Fa-f]", token):
            continue
        try:
            ipaddress.IPv6Address(token)
        except ValueError:
            continue
        yield m.span()


def _digits(s: str) -> int:
    return sum(c.isdigit() for c in s)


def _phone(text: str) -> Iterator[tuple[int, int]]:
    for m in _PHONE.finditer(text):
        s = m.group(0)
        n = _digits(s)
        if not 9 <= n <= 15 or _DATE_ONLY.match(s):
            continue
        # A run of digits with no separator and no "+" is an id or an amount, not a phone
        # number, unless it looks like one written compactly (leading 0 or +).
        if re.fullmatch(r"\d+", s) and not s.startswith("0"):
            continue
        if re.fullmatch(r"\d{4}([ .-])\d{4}", s):  # two years, "2019-2020"
            continue
        if re.fullmatch(r"\d{3}-\d{2}-\d{4}", s):  # SSN-shaped (valid ones flagged above)
            continue
        yield m.span()


def _address(text: str) -> Iterator[tuple[int, int]]:
    for pattern in (_STREET, _UK_POSTCODE, _US_ZIP):
        for m in pattern.finditer(text):
            yield m.span()


def _dob(text: str) -> Iterator[tuple[int, int]]:
    for m in _DOB.finditer(text):
        yield m.span("date")


def _social_url(text: str) -> Iterator[tuple[int, int]]:
    for m in _URL.finditer(text):
        url = m.group(0).rstrip(".,;:!?")
        rest = url.split("://", 1)[1]
        host, _, path = rest.partition("/")
        segments = [s for s in re.split(r"[/?#]", path) if s]
        if re.search(r"(?:^|/)(?:@|~)[\w.-]+", path):
            yield m.start(), m.start() + len(url)
        elif _SOCIAL.match(host) and segments:
            first = segments[1] if segments[0].lower() in ("in", "u", "user", "users") \
                and len(segments) > 1 else segments[0]
            if first.lower() not in _SOCIAL_NON_PROFILE:
                yield m.start(), m.start() + len(url)


def _pattern(pattern: re.Pattern[str]) -> Detector:
    return lambda text: (m.span() for m in pattern.finditer(text))


DETECTORS: tuple[tuple[str, Detector, str], ...] = (
    # Order matters: an earlier kind wins a span a later one also matches (a card number is
    # not also a phone number).
    ("email", _pattern(_EMAIL), "an email address"),
    ("url_with_handle", _social_url, "a URL naming a person's profile or handle"),
    ("iban", _iban, "an IBAN (mod-97 checked)"),
    ("payment_card", _card, "a payment card number (Luhn checked)"),
    ("national_id", _pattern(_SSN), "a US social security number"),
    ("national_id", _pattern(_NINO), "a UK national insurance number"),
    ("date_of_birth", _dob, "a date of birth"),
    ("ip_address", _ip, "an IP address"),
    ("postal_address", _address, "a postal address or postcode"),
    ("phone", _phone, "a phone number"),
)


def detect(text: str) -> list[Flag]:
    """Every span of personal data the detectors find, in text order, without overlaps."""
    taken: list[tuple[int, int]] = []
    flags: list[Flag] = []
    for kind, detector, reason in DETECTORS:
        for start, end in detector(text):
            if end <= start or any(start < e and s < end for s, e in taken):
                continue
            taken.append((start, end))
            flags.append(Flag(start, end, kind, "detector", reason))
    return sorted(flags)


def merge_flags(detected: list[Flag], agent: list[Flag]) -> list[Flag]:
    """Detector flags plus the agent's, an agent flag dropped when a detector covers it."""
    out = list(detected)
    for f in agent:
        if not any(d.start <= f.start and f.end <= d.end for d in detected):
            out.append(f)
    return sorted(set(out))


def redact(text: str, spans: list[tuple[int, int, str]]) -> str:
    """``text`` with each span (start, end, kind) replaced by ``[redacted: kind]``; overlapping
    spans are merged first, spans outside the text are clipped."""
    clipped = sorted((max(0, s), min(len(text), e), k) for s, e, k in spans
                     if min(len(text), e) > max(0, s))
    merged: list[tuple[int, int, str]] = []
    for s, e, k in clipped:
        if merged and s < merged[-1][1]:
            ps, pe, pk = merged[-1]
            merged[-1] = (ps, max(pe, e), pk if k in pk.split("+") else f"{pk}+{k}")
        else:
            merged.append((s, e, k))
    out, pos = [], 0
    for s, e, k in merged:
        out.append(text[pos:s])
        out.append(f"[redacted: {k}]")
        pos = e
    out.append(text[pos:])
    return "".join(out)
