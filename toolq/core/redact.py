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
from collections.abc import Mapping
from typing import Any

REDACTED = "[redacted]"

#: What to do when a server refuses a URL's credentials (redis-py's AuthenticationError),
#: in every place that says so: a client's error, a process's waiting line, the CLI.
CREDENTIALS_ADVICE = "check the user and password in its URL"

# Order matters: the scheme-specific patterns run before the generic
# ``key=value`` one, which would otherwise consume ``Authorization: Bearer``
# and leave the token itself behind.
#
# Every pattern is linear in its input (they read any text a request or an
# upstream sends: an 8,000-character URL in the access log once held the API's
# event loop for 5-9 s, 64 KB for over 90 s). A pattern whose token runs can
# overlap starts only where a run starts (a lookbehind), and its runs are
# possessive (``++``): a failed attempt is never retried from inside the run.
# tests/unit/test_redact.py feeds each one 1 MB of its worst shapes.
_RUN = r"[A-Za-z0-9_-]"
_NAME_WORDS = (
    r"password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key"
    r"|credential|private[_-]?key|session[_-]?id|cookie"
)
_SECRET_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"),
    re.compile(r"(?i)\b(?:bearer|basic|digest)\s++[A-Za-z0-9._~+/=-]{8,}+"),
    re.compile(r"(?i)\bauthorization[\"']?\s*+[=:]\s*+(?:[A-Za-z]++\s++)?\S++"),
    # A JWT starts a token: "eyJ-eyJ-eyJ-..." must not be tried at every "eyJ".
    re.compile(rf"(?<!{_RUN})eyJ{_RUN}{{5,}}+\.{_RUN}{{5,}}+\.{_RUN}*+"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}+"),
    re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{8,}+"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}+"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{16,}+"),
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{8,}+"),
    re.compile(r"\bAIza[A-Za-z0-9_-]{30,}+"),
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16,}+\b"),
    # Everything between "://" and the last "@" of the authority: a password,
    # or a token used as the user name (https://<token>@github.com).
    re.compile(r"(?<=://)[^\s/?#]*@"),
    # A name holding a secret word, then "=" or ":" and its value. Tried once per
    # name (where a run starts); the lookahead finds the word inside the name.
    re.compile(
        rf"(?i)(?<!{_RUN})(?={_RUN}*?(?:{_NAME_WORDS})){_RUN}++[\"']?\s*+[=:]\s*+"
        r"(?:\"[^\"]*+\"|'[^']*+'|\S++)"
    ),
)
_USERINFO = _SECRET_PATTERNS[11]
# What each pattern cannot match without (in the text lowercased): a pattern whose
# words are absent is skipped, so a long line of ordinary text costs one scan per word.
_NEEDS: tuple[tuple[str, ...], ...] = (
    ("private key",),
    ("bearer", "basic", "digest"),
    ("authorization",),
    ("eyj",),
    ("sk-",),
    ("_live_", "_test_"),
    ("gh",),
    ("github_pat_",),
    ("xox",),
    ("aiza",),
    ("akia", "asia"),
    ("://",),
    ("pass", "pwd", "secret", "token", "key", "credential", "session", "cookie"),
)

# A value fit for safe_details: one token, no spaces, no quotes, no markup.
_TOKEN_RE = re.compile(r"[A-Za-z0-9_.:/@#+,=\[\]-]+")
_IDENT_RE = re.compile(r"[A-Za-z0-9_.:/\[\]-]+")


def scrub(text: str) -> str:
    """Remove anything that looks like a credential; fold to one line."""
    return _redact_line(" ".join(str(text).split()), _SECRET_PATTERNS)


def _redact_line(line: str, patterns: tuple[re.Pattern[str], ...]) -> str:
    lowered = line.lower()
    for pattern, needs in zip(patterns, _NEEDS[-len(patterns) :], strict=True):
        if not any(word in lowered for word in needs):
            continue
        replacement = REDACTED + "@" if pattern is _USERINFO else REDACTED
        line = pattern.sub(replacement, line)
        lowered = line.lower()
    return line


# The private-key pattern above reads one folded line; a log record keeps its
# line breaks, so its key blocks are matched across them.
_PEM_BLOCK = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL
)


#: What a log record keeps of its text, cut before it is redacted (a request
#: line of 1 MB must not cost 1 MB of scanning per log line, nor fill the log):
#: each string argument (uvicorn's access line passes the path as one), each
#: line of a message or traceback, and all of it. An access line with its
#: path cut stays under the line limit, so its arguments stay as uvicorn reads them.
LOG_ARG_MAX = 2048
LOG_LINE_MAX = 4096
LOG_TEXT_MAX = 64 * 1024
#: How far back from a cut the token it falls in is dropped whole: a key cut in
#: two would no longer look like one, and its first half would be logged.
_CUT_BACK = 256


def cut(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters; else its start, marked as cut.

    The last token before the cut (up to 256 characters of it) goes too.
    """
    if len(text) <= limit:
        return text
    keep = max(0, limit - _CUT_BACK)
    tail = text[keep:limit]
    space = max(tail.rfind(" "), tail.rfind("\t"))
    kept = text[:keep] + (tail[: space + 1] if space >= 0 else "")
    return f"{kept}…[{len(text) - len(kept)} characters cut]"


def bound_text(text: str, line: int = LOG_LINE_MAX, total: int = LOG_TEXT_MAX) -> str:
    """``text`` with each line and the whole cut to their limits (:func:`cut`)."""
    if len(text) <= line and "\n" not in text:
        return text
    out = []
    for x in text.splitlines(keepends=True):
        body = x.rstrip("\r\n")
        out.append(cut(body, line) + x[len(body) :])
    return cut("".join(out), total)


def redact_text(text: str) -> str:
    """What :func:`scrub` removes, with the text's lines and spacing kept.

    For log records and tracebacks, which stay readable only in their layout.
    Idempotent, like :func:`scrub`.
    """
    text = str(text)
    if "private key" in text.lower():
        text = _PEM_BLOCK.sub(REDACTED, text)
    lines = text.splitlines(keepends=True)
    # Line by line: a quoted value left open must not swallow the lines after it.
    return "".join(_redact_line(line, _SECRET_PATTERNS[1:]) for line in lines)


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
    # No "@": a "port" that is not digits is a password typed without the "@" after it
    # (``redis://user:s3cret/0``); such a URL is refused, and its refusal quotes it.
    out = re.sub(r"(?<=://)([^\s/?#@;\[\]:]*):(?![0-9]*(?:[/?#;\s]|$))[^\s/?#@;]+", r"\1:***", out)
    return re.sub(
        r"(?i)([?&;](?:[A-Za-z0-9_-]*(?:password|passwd|pwd|secret|token|key|auth|signature)"
        r"[A-Za-z0-9_-]*)=)[^&#\s]*",
        r"\1***",
        out,
    )


# --------------------------------------------------------------------------- arguments

#: A property name that says its value is a secret: shown nowhere, whatever the value.
SECRET_NAME = re.compile(
    r"(?i)(password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|credential|authorization|cookie|session[_-]?id)"
)
#: Longest string shown in the arguments; the rest is cut (the ledger has it all).
MAX_SHOWN = 2000
#: Items of one list or object shown.
MAX_ITEMS = 200


def shown_args(value: Any, schema: Mapping[str, Any] | None = None) -> Any:
    """``value`` (an operation's arguments) as every output shows them to a person
    or an agent: the CLI (text and ``--json``), the HTTP API, its event stream, MCP,
    the console and the logs. ``schema`` is the tool's input schema, when known.

    Every string is scrubbed (:func:`scrub`, line by line) and cut to
    :data:`MAX_SHOWN`; a property the schema marks secret (``SecretStr``:
    ``format: password`` or ``writeOnly``) or whose name says it holds one
    (:data:`SECRET_NAME`) is :data:`REDACTED` whatever its value.
    """
    defs = (schema or {}).get("$defs") or {}
    return _redact(value, schema or {}, defs, 0)


def _redact(value: Any, schema: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> Any:
    schema, _nullable = unwrap_schema(schema, defs)
    if _secret_schema(schema):
        return REDACTED
    if isinstance(value, str):
        text = redact_text(value)  # line by line, and key blocks across lines
        return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…"
    if depth > 20:
        return "…"
    if isinstance(value, Mapping):
        props = schema.get("properties") or {}
        out: dict[str, Any] = {}
        for i, (key, item) in enumerate(value.items()):
            if i >= MAX_ITEMS:
                out["…"] = f"{len(value) - MAX_ITEMS} more"
                break
            name = scrub(str(key))[:200]
            if SECRET_NAME.search(str(key)):
                out[name] = REDACTED
            else:
                out[name] = _redact(item, _mapping(props.get(key)), defs, depth + 1)
        return out
    if isinstance(value, list):
        items = _mapping(schema.get("items"))
        shown = [_redact(v, items, defs, depth + 1) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            shown.append(f"… {len(value) - MAX_ITEMS} more")
        return shown
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _secret_schema(schema: Mapping[str, Any]) -> bool:
    return schema.get("format") == "password" or schema.get("writeOnly") is True


def unwrap_schema(
    prop: Mapping[str, Any], defs: Mapping[str, Any]
) -> tuple[Mapping[str, Any], bool]:
    """The property with ``$ref``/``allOf`` followed and ``X | None`` taken apart."""
    nullable = False
    for _ in range(5):  # a chain of references, never a cycle
        ref = prop.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = defs.get(ref.removeprefix("#/$defs/"))
            prop = {**(target if isinstance(target, Mapping) else {}), **_without(prop, "$ref")}
            continue
        all_of = prop.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
            prop = {**all_of[0], **_without(prop, "allOf")}
            continue
        any_of = prop.get("anyOf")
        if isinstance(any_of, list):
            others = [p for p in any_of if not (isinstance(p, Mapping) and p.get("type") == "null")]
            if len(others) < len(any_of):
                nullable = True
            if len(others) == 1 and isinstance(others[0], Mapping):
                prop = {**others[0], **_without(prop, "anyOf")}
                continue
        break
    if prop.get("type") == "null" or (
        isinstance(prop.get("type"), list) and "null" in prop["type"]
    ):
        nullable = True
    return prop, nullable


def _without(prop: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in prop.items() if k != key}
