"""The trace store: SQLite in WAL mode, written by one background thread in batches.

The proxy's request handlers never touch the database: `TraceStore.put` appends a record to a
queue and returns at once; every `flush_interval_s` the writer thread takes whatever is queued and
inserts it in transactions of up to `batch_size` records. WAL mode lets readers
(`scepsy aggregate`, `scepsy traces export`) read while the proxy writes. `close()` flushes
everything still queued before it returns, so a proxy that shuts down cleanly loses no record.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator

from scepsy.tracing.capture.records import COLUMNS, CallRecord

SCHEMA_VERSION = 1

_COLUMN_TYPES = {
    "call_id": "TEXT PRIMARY KEY",
    "llm": "TEXT NOT NULL",
    "path": "TEXT NOT NULL",
    "start_s": "REAL NOT NULL",
    "end_s": "REAL NOT NULL",
    "status": "INTEGER NOT NULL",
    "outcome": "TEXT NOT NULL",
    "workflow": "TEXT",
    "workflow_id": "TEXT",
    "model": "TEXT",
    "stream": "INTEGER NOT NULL",
    "ttft_s": "REAL",
    "prompt_tokens": "INTEGER",
    "completion_tokens": "INTEGER",
    "usage_source": "TEXT",
    "request_body": "BLOB",
    "response_body": "BLOB",
    "error": "TEXT",
    "request_bytes": "INTEGER",
    "response_bytes": "INTEGER",
}
_INSERT = f"INSERT OR REPLACE INTO calls ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"


def _connect(path: Path | str) -> sqlite3.Connection:
    connection = sqlite3.connect(str(path), check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("PRAGMA busy_timeout=5000")
    return connection


def init_schema(connection: sqlite3.Connection) -> None:
    columns = ", ".join(f"{name} {_COLUMN_TYPES[name]}" for name in COLUMNS)
    connection.execute(f"CREATE TABLE IF NOT EXISTS calls ({columns})")
    for name in COLUMNS:  # a store written by an older proxy: add the columns it lacks
        if name not in _existing_columns(connection):
            connection.execute(f"ALTER TABLE calls ADD COLUMN {name} {_COLUMN_TYPES[name]}")
    connection.execute("CREATE INDEX IF NOT EXISTS calls_workflow ON calls (workflow, workflow_id, start_s)")
    connection.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    connection.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    connection.commit()


def _existing_columns(connection: sqlite3.Connection) -> list[str]:
    return [row[1] for row in connection.execute("PRAGMA table_info(calls)")]


_STREAM = COLUMNS.index("stream")


def _row(record: CallRecord) -> tuple:
    # Runs on the writer thread while holding the GIL, so it is kept to plain attribute reads.
    row = [getattr(record, name) for name in COLUMNS]
    row[_STREAM] = int(row[_STREAM])
    return tuple(row)


class TraceStore:
    """Append-only store of call records with a batched background writer."""

    _STOP = object()

    def __init__(self, path: Path | str, batch_size: int = 256, flush_interval_s: float = 0.05):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._connection = _connect(self.path)
        init_schema(self._connection)
        self.queued = 0
        self.written = 0
        self.write_errors = 0
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="scepsy-trace-writer", daemon=True)
        self._thread.start()

    def put(self, record: CallRecord) -> None:
        with self._count_lock:
            self.queued += 1
        self._queue.put(record)

    def _drain(self) -> tuple[list[CallRecord], bool]:
        """Everything queued now (never blocks), and whether the stop marker was among it."""
        batch: list[CallRecord] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False
            if item is self._STOP:
                return batch, True
            batch.append(item)

    def _write(self, batch: list[CallRecord]) -> None:
        try:
            with self._connection:
                self._connection.executemany(_INSERT, [_row(r) for r in batch])
            self.written += len(batch)
        except sqlite3.Error:
            # Keep the proxy serving; the count is reported on shutdown.
            self.write_errors += len(batch)

    def _run(self) -> None:
        # Poll instead of blocking on the queue: a blocked writer would be woken (and take the GIL)
        # on every put, stalling the proxy's event loop; polling every flush_interval_s never does.
        stop = False
        while not stop:
            time.sleep(self.flush_interval_s)
            batch, stop = self._drain()
            for start in range(0, len(batch), self.batch_size):
                self._write(batch[start : start + self.batch_size])

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every record put so far is written (the queue is drained)."""
        deadline = time.monotonic() + timeout_s
        while self.written + self.write_errors < self.queued and time.monotonic() < deadline:
            time.sleep(0.002)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(self._STOP)
            self._thread.join()
        self._connection.close()

    def __enter__(self) -> "TraceStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_store(path: Path | str) -> Iterator[CallRecord]:
    """All records of a store, ordered by start time then call id."""
    connection = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    try:
        present = [name for name in COLUMNS if name in _existing_columns(connection)]  # older stores lack some
        cursor = connection.execute(f"SELECT {', '.join(present)} FROM calls ORDER BY start_s, call_id")
        for values in cursor:
            yield CallRecord.from_row(dict(zip(present, values)))
    finally:
        connection.close()


def write_store(path: Path | str, records: Iterable[CallRecord]) -> int:
    """Write records synchronously (tests, imports); returns how many."""
    connection = _connect(path)
    try:
        init_schema(connection)
        rows = [_row(r) for r in records]
        with connection:
            connection.executemany(_INSERT, rows)
        return len(rows)
    finally:
        connection.close()
