"""The reasoning service (claims, support and contradiction, gaps) and update rendering."""

from __future__ import annotations

from consumers.staff.reasoning import keywords, negated, read_issue, related, sentences
from consumers.staff.render import render_update

ISSUE = {"issue": "iss-00000001", "title": "Streetlights on Elm Road are broken",
         "summary": "The council ignored repair requests. Crime rose at night."}
EVIDENCE = [
    {"evidence": "evd-1", "title": "Resident letter",
     "body": "Three streetlights on Elm Road are broken since March. Thanks."},
    {"evidence": "evd-2", "title": "Council reply",
     "body": "The streetlights on Elm Road are not broken; they were repaired in April."},
    {"evidence": "evd-3", "title": "Survey",
     "body": "Residents reported broken streetlights near Elm Road in March."},
    {"evidence": "evd-4", "title": "A link only", "url": "https://example.org/x"},
]


def test_sentences_keywords_and_negation() -> None:
    assert sentences("One. Two!\nThree?  ") == ["One.", "Two!", "Three?"]
    assert keywords("The lights are broken") == {"light", "broken"}
    assert negated("The lights are not broken") and negated("They aren't working")
    assert not negated("It is not not working") and not negated("They work")
    assert related(frozenset({"light", "broken"}), frozenset({"light", "broken", "road"}))
    assert not related(frozenset({"light", "broken", "road"}), frozenset({"road", "bus", "x"}))


def test_claims_are_evidence_sentences_with_support_and_contradiction() -> None:
    reading = read_issue(ISSUE, EVIDENCE)
    by_text = {c.text: c for c in reading.claims}
    broken = by_text["Three streetlights on Elm Road are broken since March."]
    assert broken.evidence == "evd-1"
    assert broken.supported_by == ("evd-3",)
    assert broken.contradicted_by == ("evd-2",)
    repaired = by_text["The streetlights on Elm Road are not broken; they were repaired in April."]
    assert set(repaired.contradicted_by) == {"evd-1", "evd-3"} and repaired.supported_by == ()
    assert "Thanks." not in by_text  # too short to be a claim
    assert all(c.evidence != "evd-4" for c in reading.claims)  # no body, no claims


def test_gaps_are_issue_statements_no_evidence_speaks_to() -> None:
    reading = read_issue(ISSUE, EVIDENCE)
    assert [g.statement for g in reading.gaps] == ["The council ignored repair requests.",
                                                   "Crime rose at night."]
    assert all(g.id.startswith("gap-") for g in reading.gaps)
    everything = read_issue(ISSUE, [])
    assert len(everything.gaps) == 3 and everything.claims == ()


def test_the_reading_is_deterministic() -> None:
    assert read_issue(ISSUE, EVIDENCE) == read_issue(ISSUE, EVIDENCE)
    ids = [c.id for c in read_issue(ISSUE, EVIDENCE).claims]
    assert len(ids) == len(set(ids)) and all(i.startswith("clm-") for i in ids)


def test_render_update_is_the_record_arranged_never_rewritten() -> None:
    body = "The council approved repairs.  \n\n\n\nWork starts Monday.\r\n"
    out = render_update("Streetlights on Elm Road are broken", "Repairs approved", body,
                        "2026-03-05T10:00:00+00:00")
    assert out.title == "Streetlights on Elm Road are broken: Repairs approved"
    assert out.body == ("Update on “Streetlights on Elm Road are broken”\n\nRepairs approved\n\n"
                        "The council approved repairs.\n\nWork starts Monday.\n\n"
                        "Recorded 5 March 2026.")
    assert render_update("x", "y", body, "2026-03-05T10:00:00+00:00") == \
        render_update("x", "y", body, "2026-03-05T10:00:00+00:00")


def test_render_update_shortens_long_titles_and_survives_missing_parts() -> None:
    out = render_update("word " * 60, "", "", "not a date")
    assert len(out.title) <= 2 * 120 + 2 and "…" in out.title
    assert "New development" in out.body and out.body.endswith("Recorded not a date.")
