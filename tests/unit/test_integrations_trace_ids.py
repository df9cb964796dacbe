"""The OpenAI Agents SDK's trace and span ids as OpenTelemetry ids (issue 30):
``openai_agents.otel_ids``, the parent of toolq's submit span when no OpenTelemetry
span is current in the tool."""

from __future__ import annotations

import pytest

from toolq.integrations.openai_agents import otel_ids

TRACE = "trace_" + "0123456789abcdef" * 2
SPAN = "span_" + "fedcba9876543210" + "01234567"


@pytest.mark.parametrize(
    ("trace_id", "span_id", "expected"),
    [
        # the SDK's own ids: the trace id whole, the span id's first 16 hex digits
        (TRACE, SPAN, (0x0123456789ABCDEF0123456789ABCDEF, 0xFEDCBA9876543210)),
        # a no-op span's (tracing disabled)
        ("no-op", "no-op", None),
        # ids of another shape: custom ids, too short, not hex, upper case, signs
        ("trace_abc", SPAN, None),
        (TRACE, "span_0123", None),
        (TRACE.replace("0", "g"), SPAN, None),
        (TRACE.upper(), SPAN, None),
        (TRACE, "span_+123456789abcdef00000000", None),
        (TRACE, "span_1234_6789abcdef00000000", None),
        (TRACE, SPAN.replace("span", "spam"), None),
        # all zeros is not a valid OpenTelemetry id
        ("trace_" + "0" * 32, SPAN, None),
        (TRACE, "span_" + "0" * 24, None),
    ],
)
def test_otel_ids(trace_id: str, span_id: str, expected: tuple[int, int] | None) -> None:
    assert otel_ids(trace_id, span_id) == expected
