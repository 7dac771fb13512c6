"""Lexical retrieval shared by the worker's products: one analyzer and one BM25 ranker.

The issue catalog (what the concern agent's ``search_issues`` reads) and the assistant's
pattern library (what ``[CURRENT_STATE]`` suggests) rank with the same ``Ranker``, so a
"match" means the same thing in both. Pure: no I/O here.

Public names: ``Doc``, ``Hit``, ``Ranker``, ``terms``.
"""

from consumers.retrieval.bm25 import Doc, Hit, Ranker, terms

__all__ = ["Doc", "Hit", "Ranker", "terms"]
