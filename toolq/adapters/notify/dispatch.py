"""The sans-I/O core of a notifier: who waits for which ref, and what a message of
the subscription means for them.

:class:`toolq.adapters.notify.Notifier` (a thread) and :class:`toolq.adapters.notify.AsyncNotifier`
(a task) each hold one :class:`Dispatch` and do only the I/O around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from toolq.adapters.notify.format import Event, notice_ref, text_of, to_event


class Listener(Protocol):
    """One wait or watch: told each event about its ref, or None (read the record)."""

    #: Whether it hears the steps channels too (every state, and progress).
    progress: bool

    def put(self, event: Event | None) -> None: ...


L = TypeVar("L", bound=Listener)


@dataclass
class Confirmations:
    """The subscription confirmations of one group of channels."""

    channels: tuple[str, ...]
    count: int = 0

    @property
    def ready(self) -> bool:
        """Every channel confirmed: from now on nothing published is missed."""
        return self.count >= len(self.channels)


class Dispatch(Generic[L]):
    """The listeners by ref, and the confirmations of the settled and steps channels."""

    def __init__(self, channels: Sequence[str], steps_channels: Sequence[str] = ()) -> None:
        self.by_ref: dict[str, set[L]] = {}
        self.settled = Confirmations(tuple(channels))
        self.steps = Confirmations(tuple(steps_channels))

    def add(self, ref: str, listener: L) -> None:
        self.by_ref.setdefault(ref, set()).add(listener)

    def discard(self, ref: str, listener: L) -> None:
        listeners = self.by_ref.get(ref)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self.by_ref[ref]

    def count(self) -> int:
        return sum(len(listeners) for listeners in self.by_ref.values())

    def heard(self, msg: dict[str, Any]) -> Confirmations | None:
        """Hand a notice to its ref's listeners; count a confirmation, and return its
        group (None for anything else)."""
        if msg.get("type") == "message":
            text = text_of(msg["data"])
            listeners = self.by_ref.get(notice_ref(text))
            if listeners:
                event = to_event(text)
                for listener in listeners:
                    listener.put(event)
            return None
        if msg.get("type") != "subscribe":
            return None
        # The server confirms each subscription, also the one redis-py makes by itself
        # after reconnecting: from now on nothing is missed, but what was published
        # meanwhile is gone, so every listener of that group reads again.
        steps = text_of(msg.get("channel")) in self.steps.channels
        group = self.steps if steps else self.settled
        group.count += 1
        if group.count > len(group.channels):
            self.reread(steps_only=steps)
        return group

    def reread(self, steps_only: bool = False) -> None:
        """Tell every listener (of the steps channels: ``steps_only``) to read again."""
        for listeners in self.by_ref.values():
            for listener in listeners:
                if listener.progress or not steps_only:
                    listener.put(None)
