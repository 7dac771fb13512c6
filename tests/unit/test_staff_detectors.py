"""The deterministic privacy detectors: each kind, the checksums, and what must not be flagged."""

from __future__ import annotations

import pytest

from consumers.staff.detectors import Flag, detect, iban_valid, luhn_valid, merge_flags, redact


def kinds(text: str) -> list[tuple[str, str]]:
    return [(f.kind, text[f.start:f.end]) for f in detect(text)]


@pytest.mark.parametrize(("text", "kind", "span"), [
    ("Write to jane.doe+voice@example.co.uk today", "email", "jane.doe+voice@example.co.uk"),
    ("Call +44 20 7946 0958 after six", "phone", "+44 20 7946 0958"),
    ("Call (555) 123-4567 please", "phone", "(555) 123-4567"),
    ("My mobile is 07700 900123.", "phone", "07700 900123"),
    ("She lives at 221B Baker Street, London.", "postal_address", "221B Baker Street"),
    ("Post it to 12 Elm Road, Apt 4 please", "postal_address", "12 Elm Road, Apt 4"),
    ("The postcode is SW1A 1AA.", "postal_address", "SW1A 1AA"),
    ("Springfield, IL 62704 is where", "postal_address", "IL 62704"),
    ("My SSN is 123-45-6789.", "national_id", "123-45-6789"),
    ("NI number AB 12 34 56 C on file", "national_id", "AB 12 34 56 C"),
    ("Card 4111 1111 1111 1111 was charged", "payment_card", "4111 1111 1111 1111"),
    ("Card 5500-0000-0000-0004 was charged", "payment_card", "5500-0000-0000-0004"),
    ("Pay GB82 WEST 1234 5698 7654 32 now", "iban", "GB82 WEST 1234 5698 7654 32"),
    ("Pay DE89370400440532013000 now", "iban", "DE89370400440532013000"),
    ("From 192.168.1.20 at noon", "ip_address", "192.168.1.20"),
    ("From 2001:db8::8a2e:370:7334 at noon", "ip_address", "2001:db8::8a2e:370:7334"),
    ("I was born on 12 March 1985 there", "date_of_birth", "12 March 1985"),
    ("DOB: 1985-03-12.", "date_of_birth", "1985-03-12"),
    ("see https://twitter.com/janedoe for more", "url_with_handle",
     "https://twitter.com/janedoe"),
    ("see https://mastodon.social/@jane, thanks", "url_with_handle",
     "https://mastodon.social/@jane"),
    ("see https://example.org/~jdoe/page.", "url_with_handle", "https://example.org/~jdoe/page"),
])
def test_each_kind_is_found_with_its_span(text: str, kind: str, span: str) -> None:
    assert (kind, span) in kinds(text)


def test_luhn() -> None:
    assert luhn_valid("4111111111111111")
    assert luhn_valid("79927398713")
    assert not luhn_valid("4111111111111112")
    assert not luhn_valid("41111111a1111111")


def test_iban_mod97() -> None:
    assert iban_valid("GB82 WEST 1234 5698 7654 32")
    assert not iban_valid("GB83 WEST 1234 5698 7654 32")
    assert not iban_valid("GB82")


@pytest.mark.parametrize("text", [
    "Card 4111 1111 1111 1112 failed the checksum",       # Luhn fails
    "Order 1234567890123 arrived",                         # no issuer prefix, no separators
    "In 2019-2020 we counted 1500 complaints",             # years and counts
    "The meeting is at 10:30 on 12/03/2024",               # a time and a date, not a birth
    "Version 1.2.3.4 of the app; 999.1.1.1 is no address",  # version, invalid octet
    "GB83WEST12345698765432 is not an IBAN",               # mod-97 fails
    "Read https://twitter.com/search?q=lights and https://example.org/about",
    "SSN-like 000-12-3456 and 666-12-3456 are never issued",
    "Budget 3,500,000 over 24 months; 15 people came",
])
def test_ordinary_text_is_not_flagged(text: str) -> None:
    assert kinds(text) == []


def test_a_card_number_is_not_also_a_phone_number() -> None:
    assert kinds("4111 1111 1111 1111") == [("payment_card", "4111 1111 1111 1111")]


def test_flags_are_in_text_order_and_do_not_overlap() -> None:
    text = "Mail a@b.io, call +1 415 555 0100, card 4111111111111111."
    flags = detect(text)
    assert [f.start for f in flags] == sorted(f.start for f in flags)
    for a, b in zip(flags, flags[1:], strict=False):
        assert a.end <= b.start
    assert all(f.source == "detector" and text[f.start:f.end] not in f.reason for f in flags)


def test_agent_flags_inside_a_detector_span_are_dropped() -> None:
    det = [Flag(0, 10, "email", "detector", "an email address")]
    agent = [Flag(2, 5, "person_name", "agent", "a name"), Flag(20, 30, "person_name", "agent",
                                                                 "a name")]
    assert [f.start for f in merge_flags(det, agent)] == [0, 20]


def test_redact_replaces_merges_and_clips() -> None:
    text = "Jane Smith lives at 12 Elm Road."
    assert redact(text, [(0, 10, "person_name")]) == "[redacted: person_name] lives at 12 Elm Road."
    assert redact(text, [(0, 4, "a"), (2, 10, "b")]) == "[redacted: a+b] lives at 12 Elm Road."
    assert redact(text, [(20, 999, "postal_address")]) == \
        "Jane Smith lives at [redacted: postal_address]"
    assert redact(text, []) == text
