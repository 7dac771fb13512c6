"""Records of the key topic (``voice.keys``): wrapped data keys and the KEK versions in force.

A data key travels only wrapped by a key-encryption key (KEK). Erasing an id is not a record of
this module: it is a tombstone (a null value) under the id, which compaction keeps only for a
bounded time (``docs/keys.md``).
"""

from __future__ import annotations

from pydantic import Field

from schemas.base import Record, record_type


@record_type("voice.keys.data_key_wrapped.v1")
class DataKeyWrapped(Record):
    """One id's data key, wrapped under one KEK version; key = the id it seals for.

    A re-wrap (after ``voice keys rotate``) carries the same ``key_id`` under a newer KEK; a
    record with another ``key_id`` for an id already holding a key lost a creation race and is
    ignored by every reader (the first one on the partition wins).
    """

    id: str
    """The conversation, assistant chat, contribution or dataset id the key seals for."""
    tenant: str | None = None
    """The tenant of the id, when the creator knew it."""
    key_id: str = Field(min_length=8, max_length=64)
    """Random, names the data key itself (not its wrapping): equal across re-wraps."""
    version: int = Field(default=1, ge=1)
    """The data key's version (``Sealed.key_version``); one per id today."""
    kek_version: int = Field(ge=1)
    """The KEK version that wrapped it."""
    nonce: str
    """Base64 of the wrap's 96-bit nonce."""
    wrapped: str
    """Base64 of the wrapped key and its tag; the AAD binds id, version, key id, KEK version."""


@record_type("voice.keys.kek_versions.v1")
class KekVersions(Record):
    """Which KEK version wraps new keys and which are retired; key = ``KEK_RECORD_KEY``."""

    current: int = Field(ge=1)
    retired: list[int] = []
    """Versions no process unwraps with any more (every live key was re-wrapped first)."""


KEK_RECORD_KEY = "|kek"
"""The Kafka key of ``KekVersions``: '|' is refused in every sealing id, so no id collides."""
