"""The ledger: exact storage, session scoping, bounds, TTL from last use, persistence."""

import os
import sqlite3
import stat
import threading

import pytest
from reasoning_support import make_record

from k3.reasoning import Ledger


def test_put_get_is_byte_exact_and_returns_a_copy(record):
    ledger = Ledger()
    record["reasoning"] = "lone \ud800 surrogate and 漢"
    ledger.put("s", "e1", record)
    got = ledger.get("s", "e1")
    assert got == record
    got["content"] = "mutated"
    assert ledger.get("s", "e1") == record


def test_sessions_never_see_each_others_entries(record):
    ledger = Ledger()
    ledger.put("alice", "e1", record)
    assert ledger.get("bob", "e1") is None
    assert ledger.find("bob", record) is None
    assert ledger.get("alice", "e1") == record
    ledger.put("bob", "e1", make_record("other"))  # the same entry id in another session is another entry
    assert ledger.get("alice", "e1") == record


def test_fingerprint_lookup_ignores_reasoning_whitespace_and_key_order(record):
    ledger = Ledger()
    ledger.put("s", "e1", record)
    echo = {
        "role": "assistant",
        "content": [{"type": "text", "text": "  Checking.\n"}],
        "tool_calls": [
            {
                "id": "x",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{\n  "city": "Paris"\n}'},
            }
        ],
    }
    assert ledger.find("s", echo) == record
    echo["tool_calls"][0]["function"]["arguments"] = '{"city": "Rome"}'
    assert ledger.find("s", echo) is None
    assert ledger.find("s", {"content": "Checking."}) is None


def test_newest_owner_of_a_shared_fingerprint_wins_and_survives_eviction_of_the_older(clock):
    ledger = Ledger(max_entries=2, clock=clock)
    ledger.put("s", "old", make_record(reasoning="first"))
    clock.now += 1
    ledger.put("s", "new", make_record(reasoning="second"))
    assert ledger.find("s", make_record())["reasoning"] == "second"
    clock.now += 1
    ledger.put("s", "third", make_record("unrelated"))  # evicts "old"
    assert ledger.get("s", "old") is None
    assert ledger.find("s", make_record())["reasoning"] == "second"


def test_replacing_an_entry_retires_its_old_fingerprint():
    ledger = Ledger()
    ledger.put("s", "e", make_record("before"))
    ledger.put("s", "e", make_record("after"))
    assert ledger.find("s", make_record("before")) is None
    assert ledger.find("s", make_record("after"))["content"] == "after"
    assert ledger.stats()["entries"] == 1


def test_lru_eviction_by_entries_keeps_recently_read_ones(clock):
    ledger = Ledger(max_entries=3, clock=clock)
    for i in range(3):
        ledger.put("s", f"e{i}", make_record(f"t{i}"))
    assert ledger.get("s", "e0")  # e0 is now the most recently used
    ledger.put("s", "e3", make_record("t3"))
    assert ledger.get("s", "e1") is None
    assert all(ledger.get("s", k) for k in ("e0", "e2", "e3"))
    assert ledger.stats()["evictions"] == 1


def test_eviction_by_bytes():
    ledger = Ledger(max_bytes=600)
    for i in range(5):
        ledger.put("s", f"e{i}", make_record(reasoning="r" * 150))
    stats = ledger.stats()
    assert stats["bytes"] <= 600 and stats["entries"] < 5 and stats["evictions"] == 5 - stats["entries"]
    assert ledger.get("s", "e4") is not None


def test_ttl_counts_from_last_use_not_creation(clock, record):
    ledger = Ledger(ttl_s=100, clock=clock)
    ledger.put("s", "e", record)
    for _ in range(5):  # an active session keeps its early turn well past the TTL
        clock.now += 80
        assert ledger.get("s", "e") == record
    clock.now += 101
    assert ledger.get("s", "e") is None
    assert ledger.find("s", record) is None
    stats = ledger.stats()
    assert stats["expired"] == 1 and stats["entries"] == 0


def test_stats_bookkeeping(record):
    ledger = Ledger()
    ledger.put("s", "e", record)
    ledger.get("s", "e")
    ledger.get("s", "missing")
    ledger.find("s", record)
    ledger.find("s", {"content": "nope"})
    stats = ledger.stats()
    assert {k: stats[k] for k in ("entries", "hits", "misses", "fingerprint_hits", "fingerprint_misses")} == {
        "entries": 1,
        "hits": 1,
        "misses": 1,
        "fingerprint_hits": 1,
        "fingerprint_misses": 1,
    }
    assert stats["bytes"] > 0


def test_concurrent_writers_and_readers(tmp_path):
    ledger = Ledger(str(tmp_path / "ledger.sqlite"), max_entries=10_000)
    errors = []

    def worker(n: int) -> None:
        try:
            for i in range(50):
                ledger.put(f"s{n}", f"e{i}", make_record(f"{n}-{i}"))
                assert ledger.get(f"s{n}", f"e{i}")["content"] == f"{n}-{i}"
        except Exception as exc:  # noqa: BLE001 - surfaced through the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and ledger.stats()["entries"] == 200


def test_persistent_ledger_survives_reopening_and_is_private(tmp_path, record):
    path = str(tmp_path / "state" / "ledger.sqlite")
    ledger = Ledger(path)
    ledger.put("s", "e", record)
    ledger.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    reopened = Ledger(path)
    assert reopened.get("s", "e") == record
    assert reopened.find("s", record) == record
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert "s" not in {row[0] for row in sqlite3.connect(path).execute("SELECT scope FROM entries")}


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        Ledger(max_entries=0)


def test_fingerprint_lookup_prefers_the_entry_at_the_same_position_else_the_newest():
    ledger = Ledger()
    ledger.put("s", "a", make_record(reasoning="at 0"), position=0)
    ledger.put("s", "b", make_record(reasoning="at 1"), position=1)
    assert ledger.find("s", make_record(), position=0)["reasoning"] == "at 0"
    assert ledger.find("s", make_record(), position=1)["reasoning"] == "at 1"
    assert ledger.find("s", make_record(), position=5)["reasoning"] == "at 1"  # history compacted
    assert ledger.find("s", make_record())["reasoning"] == "at 1"


def test_a_ledger_file_from_before_positions_is_upgraded(tmp_path, record):
    path = str(tmp_path / "old.sqlite")
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE entries (scope TEXT NOT NULL, id TEXT NOT NULL, fp TEXT NOT NULL, record TEXT NOT NULL,"
        " size INTEGER NOT NULL, used_at REAL NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (scope, id)) WITHOUT ROWID;"
    )
    db.close()
    os.chmod(path, 0o600)
    ledger = Ledger(path)
    ledger.put("s", "a", record, position=2)
    assert ledger.find("s", record, position=2) == record
    ledger.close()
