"""Random ids (pure but for the random bytes)."""

from __future__ import annotations

import os


def uuid4_hex() -> str:
    """``uuid.uuid4().hex``, without building a UUID object (a submit makes three, a
    scheduler batch two per message; the object costs more than the random bytes)."""
    h = os.urandom(16).hex()
    return f"{h[:12]}4{h[13:16]}{'89ab'[int(h[16], 16) & 3]}{h[17:]}"
