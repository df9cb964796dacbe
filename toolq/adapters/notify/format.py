"""The notice format: what the ledger scripts and the workers publish, and how it reads.

- ``"<state> <ref>\\n<rev> <seq>\\n<envelope>"``: a transition entered a state
  (published by the ledger scripts, :mod:`toolq.adapters.ledger.scripts`, for every
  transition but a quiet field update). ``rev`` is the record's revision,
  ``seq`` the 1-based index of the history entry it appended, ``envelope``
  the envelope the transition wrote ("" if none). A waiter that read an older
  revision takes the outcome from the notice: a settled call costs no second
  read.
- ``"progress <ref>\\n{"fraction": f, "message": m}"``: what a tool reported
  through ``CallContext.progress`` (:class:`toolq.adapters.notify.ProgressPublisher`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from toolq.core.redact import scrub
from toolq.core.states import State

#: The first word of a progress notice (never a state's name).
PROGRESS = "progress"
#: The longest progress message that travels (after scrubbing).
PROGRESS_MESSAGE_MAX = 200


@dataclass(frozen=True)
class Notice:
    """A state notice as published: the state entered, the revision, the envelope JSON."""

    state: str
    rev: int
    #: The envelope JSON the transition wrote; "" when it wrote none.
    envelope: str
    #: The 1-based index of the history entry the transition appended (0: not said).
    seq: int = 0


@dataclass(frozen=True)
class Progress:
    """What a tool reported: how far it is (0..1), and a short scrubbed line."""

    fraction: float
    message: str | None = None


@dataclass(frozen=True)
class Event:
    """One notice about one operation, as waiters and watchers receive it.

    ``kind="state"``: ``state``, ``rev``, ``seq`` and ``envelope``, the JSON the
    transition wrote ("" when none; :func:`toolq.core.record.load_envelope` parses it,
    so a subscriber parses nothing it does not need). ``kind="progress"``:
    ``progress`` only.
    """

    kind: Literal["state", "progress"]
    state: State | None = None
    rev: int = 0
    progress: Progress | None = None
    envelope: str = ""
    #: The 1-based index of this state's entry in the history (``tq.aio.history(after=)``).
    seq: int = 0
    ref: str = ""


def parse_notice(text: str) -> tuple[str, Notice | None]:
    """``(ref, notice)`` of a state notice; the notice is None when the text carries no
    revision (read the record again)."""
    head, _, rest = text.partition("\n")
    state, _, ref = head.partition(" ")
    numbers, _, envelope = rest.partition("\n")
    rev, _, seq = numbers.partition(" ")
    if not rev.isdigit() or (seq and not seq.isdigit()):
        return ref, None
    return ref, Notice(state, int(rev), envelope, int(seq or 0))


def progress_notice(ref: str, fraction: float, message: str | None) -> str:
    body: dict[str, Any] = {"fraction": fraction}
    if message:
        body["message"] = scrub(message)[:PROGRESS_MESSAGE_MAX]
    return f"{PROGRESS} {ref}\n{json.dumps(body, separators=(',', ':'))}"


def notice_ref(text: str) -> str:
    """The ref a notice is about: all a subscriber needs to skip one nobody waits for."""
    head = text.partition("\n")[0]
    return head.partition(" ")[2]


def to_event(text: str) -> Event | None:
    """The event a notice says; None when it says nothing trustworthy (read the record)."""
    if text.startswith(PROGRESS + " "):
        head, _, body = text.partition("\n")
        try:
            data = json.loads(body)
            fraction = float(data["fraction"])
            message = data.get("message")
        except (ValueError, KeyError, TypeError):
            return None
        if not 0.0 <= fraction <= 1.0 or not isinstance(message, str | None):
            return None
        ref = head.partition(" ")[2]
        return Event("progress", progress=Progress(fraction, message), ref=ref)
    ref, n = parse_notice(text)
    if n is None:
        return None
    try:
        state = State(n.state)
    except ValueError:
        return None
    return Event("state", state=state, rev=n.rev, envelope=n.envelope, seq=n.seq, ref=ref)


def text_of(data: Any) -> str:
    """A Pub/Sub message's field as text (redis-py hands bytes unless told to decode)."""
    return data.decode() if isinstance(data, bytes) else str(data)
