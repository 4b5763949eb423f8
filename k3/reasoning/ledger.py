"""The ledger: the exact upstream assistant turns, so the next request can put them back.

One SQLite table, in memory or in a file (`--ledger PATH`, WAL mode, so a proxy restart loses
nothing; created 0600, and refused when other users can read it). Entries are scoped by a session key: every lookup names its session, and another
session's entry is simply not there. Only a hash of the session key is stored.

A client that strips reasoning is matched by the fingerprint of the visible turn plus its
position (how many assistant turns precede it in the history): an agent that repeats a turn
word for word gets each copy's own reasoning back. When no entry has that position (the client
compacted its history), the newest entry with the fingerprint answers.

Bounded by entry count and total bytes (least recently used goes first) and by a TTL measured
from last use, so a long agent session keeps its early turns while it is active. All methods
are thread-safe; each is one or two indexed statements on a local database, cheap enough to call
from the event loop.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable

from k3.reasoning.fingerprint import fingerprint
from k3.reasoning.private import check_private_file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    scope TEXT NOT NULL,
    id TEXT NOT NULL,
    fp TEXT NOT NULL,
    record TEXT NOT NULL,
    size INTEGER NOT NULL,
    used_at REAL NOT NULL,
    seq INTEGER NOT NULL,
    pos INTEGER,
    PRIMARY KEY (scope, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_by_fp ON entries (scope, fp, seq);
CREATE INDEX IF NOT EXISTS entries_by_seq ON entries (seq);
CREATE INDEX IF NOT EXISTS entries_by_use ON entries (used_at);
"""


def scope_of(session_key: str) -> str:
    """What the ledger stores instead of the session key itself."""
    return hashlib.sha256(b"k3-ledger-scope\0" + session_key.encode("utf-8", "surrogatepass")).hexdigest()[
        :32
    ]


class Ledger:
    def __init__(
        self,
        path: str | None = None,
        *,
        max_entries: int = 4096,
        max_bytes: int = 128 << 20,
        ttl_s: float = 7 * 24 * 3600,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl_s <= 0:
            raise ValueError("ledger limits must be positive")
        self.path, self.max_entries, self.max_bytes, self.ttl_s = path, max_entries, max_bytes, ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("hits", "misses", "fingerprint_hits", "fingerprint_misses", "evictions", "expired"), 0
        )
        if path is None:
            self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        else:
            directory = os.path.dirname(os.path.abspath(path))
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)  # private before SQLite touches it
            try:
                check_private_file(fd, path, f"run: chmod 600 {path}")
            finally:
                os.close(fd)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(entries)")}
        if "pos" not in columns:  # a ledger file written before positions were recorded
            self._db.execute("ALTER TABLE entries ADD COLUMN pos INTEGER")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(self, session_key: str, entry_id: str, record: dict, position: int | None = None) -> None:
        """Store (or replace) a turn record, `position` assistant turns into its conversation;
        evicts least recently used entries over the limits."""
        text = json.dumps(record, separators=(",", ":"))  # ASCII escapes keep lone surrogates storable
        now = self._clock()
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._expire(now)
            self._db.execute(
                "INSERT INTO entries (scope, id, fp, record, size, used_at, seq, pos) VALUES (?, ?, ?, ?, ?, ?, "
                " (SELECT COALESCE(MAX(seq), 0) + 1 FROM entries), ?) "
                "ON CONFLICT (scope, id) DO UPDATE SET fp = excluded.fp, record = excluded.record, "
                " size = excluded.size, used_at = excluded.used_at, seq = excluded.seq, pos = excluded.pos",
                (scope_of(session_key), entry_id, fingerprint(record), text, len(text), now, position),
            )
            self._evict()

    def get(self, session_key: str, entry_id: str) -> dict | None:
        """The record stored under this id for this session, or None."""
        return self._lookup("id", (scope_of(session_key), entry_id), None, "hits", "misses")

    def find(self, session_key: str, message: dict, position: int | None = None) -> dict | None:
        """The record of this session whose visible text and tool calls match `message`: the one
        recorded at `position` when there is one, else the newest."""
        return self._lookup(
            "fp",
            (scope_of(session_key), fingerprint(message)),
            position,
            "fingerprint_hits",
            "fingerprint_misses",
        )

    def stats(self) -> dict:
        with self._lock:
            entries, total = self._db.execute("SELECT COUNT(*), TOTAL(size) FROM entries").fetchone()
            return {"entries": entries, "bytes": int(total), **self._counts}

    def _lookup(
        self, column: str, key: tuple[str, str], position: int | None, hit: str, miss: str
    ) -> dict | None:
        now = self._clock()
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._expire(now)
            row = self._db.execute(
                f"SELECT id, record FROM entries WHERE scope = ? AND {column} = ? "
                "ORDER BY pos IS ? DESC, seq DESC LIMIT 1",
                (*key, position),
            ).fetchone()
            if row is None:
                self._counts[miss] += 1
                return None
            self._db.execute(
                "UPDATE entries SET used_at = ?, seq = (SELECT MAX(seq) + 1 FROM entries) WHERE scope = ? AND id = ?",
                (now, key[0], row[0]),
            )
            self._counts[hit] += 1
            return json.loads(row[1])

    def _expire(self, now: float) -> None:
        gone = self._db.execute("DELETE FROM entries WHERE used_at < ?", (now - self.ttl_s,)).rowcount
        self._counts["expired"] += max(gone, 0)

    def _evict(self) -> None:
        count, total = self._db.execute("SELECT COUNT(*), TOTAL(size) FROM entries").fetchone()
        if count <= self.max_entries and total <= self.max_bytes:
            return
        victims = []
        for scope, entry_id, size in self._db.execute("SELECT scope, id, size FROM entries ORDER BY seq"):
            if count <= self.max_entries and total <= self.max_bytes:
                break
            victims.append((scope, entry_id))
            count, total = count - 1, total - size
        self._db.executemany("DELETE FROM entries WHERE scope = ? AND id = ?", victims)
        self._counts["evictions"] += len(victims)
