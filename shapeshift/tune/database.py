"""The tuning database: SQLite, safe for several processes on one file, resumable.

Tables: ``workloads`` (structural hash, key, K, N; K and N are 0 for a batched GEMM, whose
key holds its sizes), ``candidates`` (a schedule as canonical JSON), ``measurements``
(workload, candidate, M, thread count -> seconds or an error) and ``selections`` (a
strategy's kernel set and decision tree, as JSON, with the CPU model and target key it was
measured on; NULL in rows from before that column existed). WAL mode lets readers run beside a
writer; every write is one short transaction, and SQLite's busy timeout makes a second
writer wait instead of failing. Measurements are keyed by (workload, candidate, M,
threads) and inserted with ``OR IGNORE``: a pair already measured is never measured again,
so a killed tuning run resumes where it stopped.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from ..codegen.kernels.gemm import GemmSchedule
from ..errors import ShapeshiftError
from ..target import Target, host_target
from . import space
from .workload import BatchedGemmWorkload, GemmWorkload

DEFAULT_DB = "shapeshift_tuning.db"

SCHEMA = """
CREATE TABLE IF NOT EXISTS workloads (
    id INTEGER PRIMARY KEY, hash TEXT UNIQUE NOT NULL, key TEXT NOT NULL, k INTEGER NOT NULL, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY, schedule TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS measurements (
    workload_id INTEGER NOT NULL REFERENCES workloads(id),
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    m INTEGER NOT NULL, threads INTEGER NOT NULL,
    seconds REAL, error TEXT, created REAL NOT NULL,
    PRIMARY KEY (workload_id, candidate_id, m, threads));
CREATE TABLE IF NOT EXISTS selections (
    id INTEGER PRIMARY KEY, workload_id INTEGER NOT NULL REFERENCES workloads(id),
    lo INTEGER NOT NULL, hi INTEGER NOT NULL, threads INTEGER NOT NULL, strategy TEXT NOT NULL,
    kernels TEXT NOT NULL, tree TEXT NOT NULL, created REAL NOT NULL, target TEXT);
"""


def has_target_column(conn: sqlite3.Connection) -> bool:
    """Whether the selections table records the CPU of each selection."""
    return any(row[1] == "target" for row in conn.execute("PRAGMA table_info(selections)"))


class Database:
    def __init__(self, path: Path | str = DEFAULT_DB, timeout_s: float = 60.0):
        self.path = Path(path)
        self.conn = None
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            with self._tx():
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
                if not has_target_column(self.conn):
                    # A database from before selections recorded their CPU: its rows keep
                    # NULL (an unknown CPU, see records.py), new ones record theirs.
                    self.conn.execute("ALTER TABLE selections ADD COLUMN target TEXT")
        except sqlite3.Error as exc:
            # A file that is not a database (or not ours) is left exactly as it was.
            if self.conn is not None:
                self.conn.close()
            raise ShapeshiftError(f"tuning database {self.path} cannot be opened: {exc}") from None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT: takes the write lock up front, so two writers queue
        on the busy timeout instead of one failing at commit."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:  # locked past the timeout, read-only, ...
            raise ShapeshiftError(f"tuning database {self.path} cannot be written: {exc}") from None
        try:
            yield
        except sqlite3.Error as exc:  # a table of another layout, a read-only file, a full disk
            self.conn.execute("ROLLBACK")
            raise ShapeshiftError(f"tuning database {self.path}: {exc} (a database of other tables than "
                                  f"shapeshift tune's, or one it cannot write)") from None
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def workload_id(self, workload: GemmWorkload | BatchedGemmWorkload) -> int:
        with self._tx():
            self.conn.execute("INSERT OR IGNORE INTO workloads (hash, key, k, n) VALUES (?, ?, ?, ?)",
                              (workload.hash, workload.key, *workload.db_kn))
            return self.conn.execute("SELECT id FROM workloads WHERE hash = ?", (workload.hash,)).fetchone()[0]

    def candidate_id(self, schedule: GemmSchedule) -> int:
        text = space.to_json(schedule)
        with self._tx():
            self.conn.execute("INSERT OR IGNORE INTO candidates (schedule) VALUES (?)", (text,))
            return self.conn.execute("SELECT id FROM candidates WHERE schedule = ?", (text,)).fetchone()[0]

    def schedule(self, candidate_id: int) -> GemmSchedule:
        row = self.conn.execute("SELECT schedule FROM candidates WHERE id = ?", (candidate_id,)).fetchone()
        return space.from_json(row[0])

    def add_measurements(self, workload_id: int, candidate_id: int, threads: int,
                         seconds: dict[int, float], error: Optional[str] = None, ms=()) -> None:
        """Seconds per M, or (with ``error``) a failure recorded at every M of ``ms``."""
        now = time.time()
        rows = ([(workload_id, candidate_id, m, threads, None, error, now) for m in ms] if error else
                [(workload_id, candidate_id, m, threads, s, None, now) for m, s in seconds.items()])
        with self._tx():
            self.conn.executemany("INSERT OR IGNORE INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?)", rows)

    def measurements(self, workload_id: int, threads: int) -> list[tuple[int, int, Optional[float], Optional[str]]]:
        """(candidate_id, M, seconds, error) of every measurement of the workload."""
        return self.conn.execute(
            "SELECT candidate_id, m, seconds, error FROM measurements WHERE workload_id = ? AND threads = ? "
            "ORDER BY candidate_id, m", (workload_id, threads)).fetchall()

    def measured_ms(self, workload_id: int, candidate_id: int, threads: int) -> set[int]:
        rows = self.conn.execute("SELECT m FROM measurements WHERE workload_id = ? AND candidate_id = ? AND threads = ?",
                                 (workload_id, candidate_id, threads)).fetchall()
        return {r[0] for r in rows}

    def failed_candidates(self, workload_id: int, threads: int) -> set[int]:
        rows = self.conn.execute("SELECT DISTINCT candidate_id FROM measurements WHERE workload_id = ? "
                                 "AND threads = ? AND error IS NOT NULL", (workload_id, threads)).fetchall()
        return {r[0] for r in rows}

    def add_selection(self, workload_id: int, lo: int, hi: int, threads: int, strategy: str,
                      kernels: list[dict], tree: dict, target: Optional[Target] = None) -> int:
        """Record a kernel set and tree, with the CPU it was measured on (``target``, this
        machine by default): sessions apply it only on the same CPU model and flags."""
        measured_on = target or host_target()
        with self._tx():
            cur = self.conn.execute(
                "INSERT INTO selections (workload_id, lo, hi, threads, strategy, kernels, tree, created, target) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (workload_id, lo, hi, threads, strategy, json.dumps(kernels), json.dumps(tree), time.time(),
                 json.dumps({"key": measured_on.key, "cpu_model": measured_on.cpu_model})))
            return cur.lastrowid

    def latest_selection(self, workload_id: int, lo: int, hi: int, threads: int, strategy: str) -> Optional[dict]:
        row = self.conn.execute(
            "SELECT kernels, tree FROM selections WHERE workload_id = ? AND lo = ? AND hi = ? AND threads = ? "
            "AND strategy = ? ORDER BY id DESC LIMIT 1", (workload_id, lo, hi, threads, strategy)).fetchone()
        return None if row is None else {"kernels": json.loads(row[0]), "tree": json.loads(row[1])}
