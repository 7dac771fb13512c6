"""The one BM25 ranker (``consumers.retrieval``): its analyzer, scores checked against the
formula by hand, why a hit was found, and the relevance that makes a match strong."""

from __future__ import annotations

import math

import pytest

from consumers.retrieval import Doc, Ranker, terms


def test_terms_lowercase_drop_stop_words_and_plurals() -> None:
    assert terms("The Oak Street lights are out again, please fix them!") == [
        "oak", "street", "light", "out", "fix"]
    assert terms("Parties, buses and glasses") == ["party", "buse", "glass"]
    assert terms("it's the council's bins") == ["council", "bin"]


def test_scores_are_okapi_bm25_with_lucene_idf() -> None:
    """One document out of three holds ``oak`` once in five terms: the score is the formula's,
    computed here by hand (k1 = 1.2, b = 0.75, idf = ln(1 + (N - n + .5) / (n + .5)))."""
    docs = [Doc("a", "oak tree near the lake road bench"),
            Doc("b", "bench paint peeling"),
            Doc("c", "lake water dirty")]
    hit, = Ranker(docs).search("oak")
    lengths = [len(terms(d.text)) for d in docs]
    avgdl = sum(lengths) / 3
    idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    tf = 1
    want = idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * lengths[0] / avgdl))
    assert hit.id == "a" and hit.score == pytest.approx(want, abs=1e-4)


def test_a_single_document_corpus_scores_positive() -> None:
    """Okapi's own idf is negative for a word in over half the documents (here: all of one);
    Lucene's is not, so a tenant's first issue can be found."""
    hit, = Ranker([Doc("iss-1", "", head="Broken streetlights on Oak Street")]).search(
        "oak street")
    assert hit.score > 0 and hit.matched == ("oak", "street")


def test_rarer_words_weigh_more_and_ties_keep_corpus_order() -> None:
    docs = [Doc("common", "street street"), Doc("rare", "street pothole"),
            Doc("other", "street noise"), Doc("same", "street noise")]
    ranked = [h.id for h in Ranker(docs).search("pothole street")]
    assert ranked[0] == "rare"
    assert ranked.index("other") < ranked.index("same")  # equal scores: corpus order


def test_a_word_written_apart_matches_the_compound() -> None:
    hit, = Ranker([Doc("iss-1", "", head="Broken streetlights on Oak Street")]).search(
        "the lights on oak street are out")
    assert hit.matched == ("light~streetlight", "oak", "street")


def test_relevance_is_how_much_of_the_head_the_query_covers() -> None:
    ranker = Ranker([Doc("lights", "Lamps dark for weeks", head="Broken streetlights on "
                         "Oak Street"),
                     Doc("noise", "", head="Traffic noise at night")])
    lights = ranker.search("The Oak Street lights are out again")[0]
    assert lights.id == "lights" and lights.relevance == pytest.approx(0.75, abs=0.01)
    partial = ranker.search("Dogs barking on Oak Street")[0]
    assert partial.id == "lights" and partial.relevance == pytest.approx(0.5, abs=0.01)
    assert ranker.search("Dogs barking on Oak Street", floor=0.6) == []


def test_nothing_matched_nothing_found() -> None:
    assert Ranker([Doc("a", "potholes on main road")]).search("library opening hours") == []
    assert Ranker([]).search("anything") == []
    assert Ranker([Doc("a", "road")]).search("") == []
