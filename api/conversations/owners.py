"""The index of conversations by owner, as an edge that holds only those in use reads it.

An edge started with ``VOICE_EDGE_HISTORY_S`` holds the conversations in use (decision 0011),
so what it holds is not a participant's whole list. ``voice.owners`` is: one
``ConversationIndexed`` a conversation, keyed by owner (``streams.ids.owner_key``), written
from the log by the worker (decision 0015). ``OwnerIndex`` reads one owner's records when its
list is asked for (``ensure``: from the partition's start — there is no time in the key),
keeps them while the owner lists now and then, and drops them after a window unused
(``evict_idle``), like the conversations.

The tail reads the topic from its end: a record of an owner held here is applied, of one being
read held for after the read (``ReadOnDemand``), of any other dropped — the read brings it
when the owner is next asked for. An owner read and found with none is remembered as having
none until a record of theirs comes by the tail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from api.conversations.listing import StartOrdered
from api.frame.on_demand import ReadOnDemand
from api.frame.projection import Caller
from schemas.conversation import ConversationIndexed
from streams.envelope import Envelope
from streams.ids import owner_key


@dataclass(kw_only=True)
class OwnerEntries:
    """The conversations one owner (in one tenant) started, in the order they started."""

    tenant: str | None
    conversations: StartOrdered = field(default_factory=StartOrdered)
    used_at: float = field(default_factory=time.monotonic)


class OwnerIndex(ReadOnDemand[OwnerEntries]):
    """Owners' entries of ``voice.owners``, read on demand (``cold``) and held while used."""

    FOUNDED_BY = ConversationIndexed

    def apply(self, env: Envelope) -> OwnerEntries | None:
        """Apply one index record read for its owner (from the log, or held while that read
        ran): a set, so a record again changes nothing. A record whose key is not its own
        owner's is not applied."""
        rec = env.record
        if not isinstance(rec, ConversationIndexed) or env.key != owner_key(env.tenant,
                                                                            rec.owner):
            return None
        view = self.by_key.get(env.key)
        if view is None:
            view = self.by_key[env.key] = OwnerEntries(tenant=env.tenant)
        view.conversations.add(rec.conversation)
        self.notify(env.key)
        return view

    def on_tail(self, env: Envelope) -> None:
        """The tail's handler: applied if the owner is held here, else held while the owner
        is read, else dropped (an owner remembered as having none is read again next time)."""
        if env.key in self.by_key:
            self.apply(env)
            return
        self.held_back(env.key, env)
        self._absent.pop(env.key, None)

    def used(self, view: OwnerEntries) -> None:
        view.used_at = time.monotonic()

    def last_used(self, view: OwnerEntries) -> float:
        return view.used_at

    def conversations_of(self, who: Caller) -> StartOrdered:
        """The conversations ``who`` started in its tenant, as far as this edge has read them
        (``ensure`` the caller's key first), in start order."""
        view = self.by_key.get(owner_key(who.tenant, who.sub))
        return StartOrdered() if view is None or view.tenant != who.tenant \
            else view.conversations
