"""The ledger's formats (toolq.decisions.formats) as tables, and the check every
process makes (toolq.adapters.ledger.stored_format) on fakeredis."""

from __future__ import annotations

import json

import fakeredis
import pytest

from toolq.adapters.ledger import Ledger
from toolq.adapters.ledger.upgrade import migrate
from toolq.core import errors
from toolq.core.keys import Keys
from toolq.decisions import formats
from toolq.decisions.formats import FORMAT


@pytest.mark.parametrize(
    ("key", "target"),
    [
        ("toolq:op:run/1", "{toolq}:op:run/1"),
        ("toolq:op:a:b:c", "{toolq}:op:a:b:c"),
        ("toolq:hist:run/1", "{toolq}:hist:run/1"),
        ("toolq:idx:pay:queued", "{toolq}:idx:pay:queued"),
        ("toolq:due", "{toolq}:due"),
        ("toolq:tools", "{toolq}:tools"),
        ("toolq:stats", "{toolq}:stats"),
        ("toolq:wake", None),  # transient: deleted
        ("toolq:sleep_until", None),
        ("toolq:schedulers", None),
        ("toolq:op:", None),  # no ref
        ("toolq:other", None),  # not the ledger's
        ("toolq.calls", None),  # Celery's queue
        ("{toolq}:op:run/1", None),  # today's
        ("toolqx:op:run/1", None),  # another prefix
    ],
)
def test_a_format_1_key_is_renamed_to_its_tagged_name(key: str, target: str | None) -> None:
    assert formats.v1_target("toolq", key) == target


@pytest.mark.parametrize(
    ("key", "old"),
    [
        ("toolq:op:r", True),
        ("toolq:wake", True),
        ("toolq:schedulers", True),
        ("toolq:other", False),
        ("{toolq}:op:r", False),
        ("toolq.verify", False),
    ],
)
def test_which_keys_a_format_1_ledger_wrote(key: str, old: bool) -> None:
    assert formats.is_v1_key("toolq", key) is old


@pytest.mark.parametrize(
    ("v1_keys", "history_lists", "found"),
    [(True, True, 1), (True, False, 1), (False, True, 2), (False, False, FORMAT)],
)
def test_an_unversioned_ledger_is_what_its_keys_say(
    v1_keys: bool, history_lists: bool, found: int
) -> None:
    assert formats.unversioned_format(v1_keys, history_lists) == found


@pytest.mark.parametrize(
    ("found", "says"),
    [
        (FORMAT, None),
        (1, "`toolq migrate`"),
        (2, "`toolq migrate`"),
        (FORMAT + 1, "upgrade toolq"),
    ],
)
def test_refusal_names_what_to_do(found: int, says: str | None) -> None:
    why = formats.refusal("toolq", found)
    assert (why is None) if says is None else (why is not None and says in why)


@pytest.mark.parametrize(("found", "sources"), [(1, [1, 2]), (2, [2]), (FORMAT, [])])
def test_steps_from_each_format(found: int, sources: list[int]) -> None:
    assert [s.source for s in formats.steps(found)] == sources


def test_every_earlier_format_has_a_step_and_a_description() -> None:
    assert [s.source for s in formats.STEPS] == list(range(1, FORMAT))
    assert sorted(formats.DESCRIPTIONS) == list(range(1, FORMAT + 1))
    with pytest.raises(ValueError, match="upgrade toolq"):
        formats.steps(FORMAT + 1)


@pytest.mark.parametrize(("raw", "found"), [(None, None), ("3", 3), (b"2", 2), ("12", 12)])
def test_the_recorded_format(raw: str | bytes | None, found: int | None) -> None:
    assert formats.recorded_format(raw) == found


@pytest.mark.parametrize("raw", ["", "three", "0", "-1", "2.5"])
def test_a_recorded_format_that_is_no_number_is_refused(raw: str) -> None:
    with pytest.raises(formats.FormatError, match="not a number"):
        formats.recorded_format(raw)


@pytest.mark.parametrize(
    ("entry", "today"),
    [
        (
            '{"to":"queued","at":1764496000123,"attempt":1,"by":"submit"}',
            '{"at":1764496000123,"to":"queued","attempt":1,"by":"submit"}',
        ),
        (  # cjson's spelling of a whole number, and a code
            '{"at":1.764496000123e+12,"from":"running","to":"waiting_retry",'
            '"attempt":1,"by":"worker","code":"RATE_LIMITED"}',
            '{"at":1764496000123,"from":"running","to":"waiting_retry","attempt":1,'
            '"by":"worker","code":"RATE_LIMITED"}',
        ),
        (  # no attempt, no by: today's defaults
            '{"at":5,"to":"awaiting_approval"}',
            '{"at":5,"to":"awaiting_approval","attempt":0,"by":""}',
        ),
    ],
)
def test_a_history_entry_in_todays_spelling(entry: str, today: str) -> None:
    assert formats.history_entry(entry) == today


def test_a_history_list_becomes_fields() -> None:
    entries = [json.dumps({"at": n, "to": "queued", "attempt": 1, "by": "x"}) for n in (1, 2)]
    fields = formats.history_fields(entries)
    assert fields["hn"] == "2" and sorted(fields) == ["h1", "h2", "hn"]
    assert json.loads(fields["h2"])["at"] == 2


# ------------------------------------------------------------------ the check, on fakeredis


def test_an_empty_ledger_is_stamped_by_its_first_process() -> None:
    r = fakeredis.FakeRedis()
    Ledger(r, "p").record_cells()
    assert r.hget(Keys("p").meta, "format") == str(FORMAT).encode()
    Ledger(r, "p").record_cells()  # and read as today's by the next


@pytest.mark.parametrize(("key", "found"), [("p:op:r1", 1), ("p:due", 1), ("{p}:hist:r1", 2)])
def test_an_unversioned_ledger_of_an_earlier_format_is_refused_and_not_stamped(
    key: str, found: int
) -> None:
    r = fakeredis.FakeRedis()
    r.rpush(key, "x") if "hist" in key else r.set(key, "x")
    with pytest.raises(errors.LedgerFormat, match="run `toolq migrate`") as refused:
        Ledger(r, "p").record_cells()
    assert refused.value.code == "LEDGER_FORMAT"
    assert refused.value.details == {"found": found, "expected": FORMAT}
    assert r.hget(Keys("p").meta, "format") is None
    with pytest.raises(errors.LedgerFormat):  # the first submit checks too
        Ledger(r, "p").submit(ref="r2")


@pytest.mark.parametrize(("recorded", "says"), [("2", "toolq migrate"), ("99", "upgrade toolq")])
def test_a_recorded_format_other_than_todays_is_refused(recorded: str, says: str) -> None:
    r = fakeredis.FakeRedis()
    r.hset(Keys("p").meta, "format", recorded)
    with pytest.raises(errors.LedgerFormat, match=says):
        Ledger(r, "p").record_cells()


def test_another_prefixs_old_keys_do_not_count() -> None:
    r = fakeredis.FakeRedis()
    r.set("other:op:r1", "x")
    Ledger(r, "p").record_cells()
    assert r.hget(Keys("p").meta, "format") == str(FORMAT).encode()


def test_migrate_refuses_a_newer_format_and_stamps_a_ledger_of_todays_shape() -> None:
    r = fakeredis.FakeRedis()
    r.hset(Keys("p").meta, "format", FORMAT + 1)
    with pytest.raises(errors.LedgerFormat, match="upgrade toolq"):
        migrate(r, "p")
    r.delete(Keys("p").meta)
    done = migrate(r, "p", dry_run=True)
    assert done.found == FORMAT and done.stamped and r.hget(Keys("p").meta, "format") is None
    assert migrate(r, "p").stamped
    assert migrate(r, "p").already


def test_long_work_shows_progress_and_a_dry_run_counts_what_a_run_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from toolq.adapters.ledger import upgrade

    monkeypatch.setattr(upgrade, "EVERY", 3)
    monkeypatch.setattr(upgrade, "FOLD_BATCH", 3)
    r = fakeredis.FakeRedis()
    for n in range(5):
        r.hset(f"p:op:r{n}", mapping={"ref": f"r{n}", "state": "queued"})
        r.rpush(f"p:hist:r{n}", json.dumps({"at": n, "to": "queued", "attempt": 1, "by": "s"}))
    r.zadd("p:due", {"r0": 1})
    r.set("p:wake", "1")
    lines: list[str] = []
    dry = migrate(r, "p", dry_run=True, progress=lines.append)
    assert (dry.found, dry.renamed, dry.deleted, dry.histories) == (1, 11, 1, 5)
    assert r.exists("p:op:r0") and not r.exists(Keys("p").meta)
    lines.clear()
    done = migrate(r, "p", progress=lines.append)
    assert (done.renamed, done.deleted, done.histories, done.entries) == (11, 1, 5, 5)
    assert "  12 of 12 keys" in lines and "  3 of 5 histories" in lines, lines
    assert lines[0].startswith("step 1 -> 2: rename every key") and "{p}:op:<ref>" in lines[0]
    assert r.hget(Keys("p").op("r4"), "hn") == b"1" and not r.keys("p:*")
    assert r.zscore(Keys("p").due, "r0") == 1 and not r.exists("{p}:wake")
    Ledger(r, "p").record_cells()
    assert migrate(r, "p").already
