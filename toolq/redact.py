"""Scrubbing of untrusted text before it reaches any envelope, log line or repr.

Two tools, for two kinds of text:

- :func:`scrub` keeps prose readable and removes what looks like a credential.
  It is idempotent, so a scrubbed message that is parsed again stays the same.
- :func:`safe_value` and :func:`scrub_identifier` are for values that go to an
  agent (``safe_details``, field names, codes): they return nothing rather than
  a cleaned-up version of something suspicious, because a partial secret or a
  sentence with its spaces removed is still not safe to show.
"""

from __future__ import annotations

import re

REDACTED = "[redacted]"

# Order matters: the scheme-specific patterns run before the generic
# ``key=value`` one, which would otherwise consume ``Authorization: Bearer``
# and leave the token itself behind.
_SECRET_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"),
    re.compile(r"(?i)\b(?:bearer|basic|digest)\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?i)\bauthorization[\"']?\s*[=:]\s*(?:[A-Za-z]+\s+)?\S+"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{8,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{16,}"),
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{8,}"),
    re.compile(r"\bAIza[A-Za-z0-9_-]{30,}"),
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16,}\b"),
    # Everything between "://" and the last "@" of the authority: a password,
    # or a token used as the user name (https://<token>@github.com).
    re.compile(r"(?<=://)[^\s/?#]*@"),
    re.compile(
        r"(?i)[A-Za-z0-9_-]*(?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key"
        r"|credential|private[_-]?key|session[_-]?id|cookie)[A-Za-z0-9_-]*[\"']?\s*[=:]\s*"
        r"(?:\"[^\"]*\"|'[^']*'|\S+)"
    ),
)
_USERINFO = _SECRET_PATTERNS[11]

# A value fit for safe_details: one token, no spaces, no quotes, no markup.
_TOKEN_RE = re.compile(r"[A-Za-z0-9_.:/@#+,=\[\]-]+")
_IDENT_RE = re.compile(r"[A-Za-z0-9_.:/\[\]-]+")


def scrub(text: str) -> str:
    """Remove anything that looks like a credential; fold to one line."""
    out = " ".join(str(text).split())
    for pattern in _SECRET_PATTERNS:
        replacement = REDACTED + "@" if pattern is _USERINFO else REDACTED
        out = pattern.sub(replacement, out)
    return out


# The private-key pattern above reads one folded line; a log record keeps its
# line breaks, so its key blocks are matched across them.
_PEM_BLOCK = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL
)


def redact_text(text: str) -> str:
    """What :func:`scrub` removes, with the text's lines and spacing kept.

    For log records and tracebacks, which stay readable only in their layout.
    Idempotent, like :func:`scrub`.
    """
    lines = _PEM_BLOCK.sub(REDACTED, str(text)).splitlines(keepends=True)
    # Line by line: a quoted value left open must not swallow the lines after it.
    return "".join(_redact_line(line) for line in lines)


def _redact_line(line: str) -> str:
    for pattern in _SECRET_PATTERNS[1:]:
        replacement = REDACTED + "@" if pattern is _USERINFO else REDACTED
        line = pattern.sub(replacement, line)
    return line


def looks_secret(text: str) -> bool:
    """True when :func:`scrub` would remove something from ``text``."""
    return scrub(text) != " ".join(str(text).split())


def _looks_random(text: str) -> bool:
    # Keys without a known prefix (an AWS secret key, a random API token) are
    # long runs that mix cases and digits; identifiers and refs rarely are.
    for run in re.split(r"[_.:/@#,=\[\]-]", text):
        mixed = (
            any(c.islower() for c in run)
            and any(c.isupper() for c in run)
            and any(c.isdigit() for c in run)
        )
        if len(run) >= 20 and mixed:
            return True
    return False


def safe_value(text: str, limit: int = 200) -> str | None:
    """``text`` if it is one short, secret-free token; otherwise ``None``.

    Prose is refused by shape: anything with whitespace, quotes or markup is
    not a value an agent needs, and is how upstream instructions would travel.
    """
    value = str(text)
    if not value or len(value) > limit or not _TOKEN_RE.fullmatch(value):
        return None
    if looks_secret(value) or _looks_random(value):
        return None
    return value


def scrub_identifier(text: str, limit: int = 64) -> str:
    """An identifier-like string (a field name, a rule, a code) or ``""``.

    Unlike an earlier version, characters are never stripped to make a value
    fit: "ignore your policy" must not come out as "ignoreyourpolicy".
    """
    value = str(text)
    if len(value) > limit or not _IDENT_RE.fullmatch(value):
        return ""
    if looks_secret(value) or _looks_random(value):
        return ""
    return value


def redact_url(url: str) -> str:
    """A URL fit for logs: the password (or a token in the user slot) replaced."""

    def _userinfo(match: re.Match[str]) -> str:
        # The user name cannot contain ":", so the first one starts the password.
        user, sep, _ = match.group(1).partition(":")
        return f"{user}:***@" if sep else "***@"

    out = re.sub(r"(?<=://)([^\s/?#]*)@", _userinfo, url)
    return re.sub(
        r"(?i)([?&;](?:[A-Za-z0-9_-]*(?:password|passwd|pwd|secret|token|key|auth|signature)"
        r"[A-Za-z0-9_-]*)=)[^&#\s]*",
        r"\1***",
        out,
    )
