"""The tuning database: SQLite, safe for several processes on one file, resumable.

Tables: ``workloads`` (a tuning task's structural hash, key and kernel family; tune/task.py),
``candidates`` (a schedule as its family's canonical JSON, and the family), ``measurements``
(workload, candidate, M, thread count, CPU -> seconds or an error, and the machine that made
it), ``machines`` (each machine that measured: its node, target description and measured
FMA peak per width, as tune/machine.py describes it) and ``selections`` (a strategy's
kernel set and decision tree, as JSON, with the CPU model and target key it was measured
on). WAL mode lets readers run beside a writer; every write is one short
transaction, and SQLite's busy timeout makes a second writer wait instead of failing.
Measurements are keyed by (workload, candidate, M, threads, CPU target key) and inserted
with ``OR IGNORE``: a pair already measured on this CPU is never measured again, so a
killed tuning run resumes where it stopped, and measurements from another CPU model never
mix with this one's.

Databases from before: ``workloads`` had K and N columns (0 for a batched GEMM) in place of
the family, candidates had no family (all were GEMM schedules), measurements and
selections did not record their CPU, measurements not their machine. Opening one for
writing migrates it in one transaction: the K and N columns go (the key holds them), the
family is ``gemm``, measurements and selections of an unknown CPU keep an empty target
(measurements) or NULL (selections), both used as this machine's, with a warning
(records.py, search.py), and measurements keep a NULL machine.

Reading without writing (``read_only``, what sessions do): a WAL database opened even with
``?mode=ro`` gets ``-wal`` and ``-shm`` files made beside it, left there after it closes. So
when no writer is at work, the file is read as immutable (no lock files, no WAL); see
``read_only`` for why that is safe and when it reads through the WAL instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, TypeVar

from ..errors import ShapeshiftError
from ..target import Target, host_target
from .gemm_family import GEMM
from .task import KernelFamily

DEFAULT_DB = "shapeshift_tuning.db"

# The target key of measurements made before measurements recorded their CPU.
UNKNOWN_TARGET = ""

SCHEMA = """
CREATE TABLE IF NOT EXISTS workloads (
    id INTEGER PRIMARY KEY, hash TEXT UNIQUE NOT NULL, key TEXT NOT NULL, family TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY, schedule TEXT UNIQUE NOT NULL, family TEXT NOT NULL DEFAULT 'gemm');
CREATE TABLE IF NOT EXISTS measurements (
    workload_id INTEGER NOT NULL REFERENCES workloads(id),
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    m INTEGER NOT NULL, threads INTEGER NOT NULL,
    seconds REAL, error TEXT, created REAL NOT NULL, target TEXT NOT NULL DEFAULT '',
    machine INTEGER REFERENCES machines(id),
    PRIMARY KEY (workload_id, candidate_id, m, threads, target));
CREATE TABLE IF NOT EXISTS machines (
    id INTEGER PRIMARY KEY, target TEXT NOT NULL, description TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS selections (
    id INTEGER PRIMARY KEY, workload_id INTEGER NOT NULL REFERENCES workloads(id),
    lo INTEGER NOT NULL, hi INTEGER NOT NULL, threads INTEGER NOT NULL, strategy TEXT NOT NULL,
    kernels TEXT NOT NULL, tree TEXT NOT NULL, created REAL NOT NULL, target TEXT);
"""

# Each migration: (is it needed, given the table's columns), then its statements.
_MIGRATIONS = (
    ("workloads", lambda cols: "family" not in cols, (
        "CREATE TABLE workloads_new (id INTEGER PRIMARY KEY, hash TEXT UNIQUE NOT NULL, key TEXT NOT NULL, "
        "family TEXT NOT NULL)",
        "INSERT INTO workloads_new (id, hash, key, family) SELECT id, hash, key, 'gemm' FROM workloads",
        "DROP TABLE workloads",
        "ALTER TABLE workloads_new RENAME TO workloads")),
    ("candidates", lambda cols: "family" not in cols, (
        "ALTER TABLE candidates ADD COLUMN family TEXT NOT NULL DEFAULT 'gemm'",)),
    ("measurements", lambda cols: "target" not in cols, (
        "CREATE TABLE measurements_new (workload_id INTEGER NOT NULL REFERENCES workloads(id), "
        "candidate_id INTEGER NOT NULL REFERENCES candidates(id), m INTEGER NOT NULL, threads INTEGER NOT NULL, "
        "seconds REAL, error TEXT, created REAL NOT NULL, target TEXT NOT NULL DEFAULT '', "
        "PRIMARY KEY (workload_id, candidate_id, m, threads, target))",
        "INSERT INTO measurements_new SELECT workload_id, candidate_id, m, threads, seconds, error, created, '' "
        "FROM measurements",
        "DROP TABLE measurements",
        "ALTER TABLE measurements_new RENAME TO measurements")),
    ("selections", lambda cols: "target" not in cols, (
        "ALTER TABLE selections ADD COLUMN target TEXT",)),
    ("measurements", lambda cols: "machine" not in cols, (
        "ALTER TABLE measurements ADD COLUMN machine INTEGER REFERENCES machines(id)",)),
)


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def has_target_column(conn: sqlite3.Connection) -> bool:
    """Whether the selections table records the CPU of each selection."""
    return "target" in columns(conn, "selections")


def check_database_path(path: Path) -> None:
    """A directory given as the database is named as one (SQLite says only "unable to open
    database file", and a reader that looks for a file, "does not exist")."""
    if path.is_dir():
        raise ShapeshiftError(f"tuning database {path} is a directory, not a database file: name a file "
                              f"(such as {path / DEFAULT_DB})")


T = TypeVar("T")
# SQLite's unix locks on the database file: a reader's SHARED lock is a read lock on bytes
# [SHARED_FIRST, SHARED_FIRST + SHARED_SIZE); the EXCLUSIVE lock a writer takes on closing
# the last connection, to checkpoint the WAL into the file and delete it, a write lock there.
PENDING_BYTE = 0x40000000
SHARED_FIRST, SHARED_SIZE = PENDING_BYTE + 2, 510


def _journals(path: Path) -> bool:
    """Whether a -wal or -journal file is beside the database: a writer is at work (or died
    in a transaction), and what is committed may be in the WAL only."""
    return any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-journal"))


def _identity(path: Path) -> tuple:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def read_only(path: Path, query: Callable[[sqlite3.Connection], T], timeout_s: float = 30.0) -> T:
    """``query(conn)`` on the database at ``path``, opened read-only, making no file beside it.

    When no -wal or -journal file is there, no connection has the database open for writing,
    and everything committed is in the file itself: it is read with ``immutable=1`` (no
    locks, no -shm, no WAL). ``immutable`` alone would be wrong beside a writer that starts
    meanwhile: its checkpoint rewrites pages of the file under the read. So the read holds a
    SHARED lock of SQLite's own protocol on the file, which stops a writer's closing
    checkpoint (and its deletion of the WAL), and the answer is kept only if no -wal or
    -journal file appeared and the file is unchanged (inode, size, times) after the read;
    otherwise, or while a writer is at work, it reads again with ``mode=ro``, through the
    writer's WAL and -shm, which then exist already.
    """
    uri = path.resolve().as_uri()  # percent-encoded: a '#', '?' or '%' in the path would end or mangle it
    if not _journals(path):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            fd = None  # unreadable: the connection below says why
        if fd is not None:
            try:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, SHARED_SIZE, SHARED_FIRST)
                    locked = True
                except OSError:  # a writer holds it: read through the WAL below
                    locked = False
                if locked:
                    before = _identity(path)
                    conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True)
                    try:
                        answer = query(conn)
                        # Checked before the close, which drops the lock (POSIX locks go with
                        # any descriptor of the file this process closes).
                        unchanged = not _journals(path) and _identity(path) == before
                    finally:
                        conn.close()
                    if unchanged:
                        return answer
            finally:
                os.close(fd)  # releases the lock
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=timeout_s)
    try:
        return query(conn)
    finally:
        conn.close()


def _enter_wal(conn: sqlite3.Connection, deadline: float) -> None:
    """``PRAGMA journal_mode=WAL``, retried until ``deadline`` while the file is locked.

    SQLite answers the mode change with SQLITE_BUSY at once, without calling the busy
    handler, while another connection holds a lock on the file (two processes opening a
    new database together): the busy timeout does not cover it, so this waits instead."""
    delay = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


class Database:
    def __init__(self, path: Path | str = DEFAULT_DB, timeout_s: float = 60.0):
        self.path = Path(path)
        check_database_path(self.path)
        # Measurements are made, and kept, for this machine's CPU model and flags.
        self.target_key = host_target().key
        self.conn = None
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
            _enter_wal(self.conn, time.monotonic() + timeout_s)
            self.conn.execute("PRAGMA synchronous=NORMAL")
            with self._tx():
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
                # A database from before (the module's docstring): migrated in place, ids kept.
                for table, needed, statements in _MIGRATIONS:
                    if needed(columns(self.conn, table)):
                        for statement in statements:
                            self.conn.execute(statement)
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

    def workload_id(self, workload) -> int:
        """The id of a tuning task (tune/task.py), added if new."""
        with self._tx():
            self.conn.execute("INSERT OR IGNORE INTO workloads (hash, key, family) VALUES (?, ?, ?)",
                              (workload.hash, workload.key, workload.family.name))
            return self.conn.execute("SELECT id FROM workloads WHERE hash = ?", (workload.hash,)).fetchone()[0]

    def candidate_id(self, schedule, family: KernelFamily = GEMM) -> int:
        text = family.to_json(schedule)
        with self._tx():
            self.conn.execute("INSERT OR IGNORE INTO candidates (schedule, family) VALUES (?, ?)", (text, family.name))
            return self.conn.execute("SELECT id FROM candidates WHERE schedule = ?", (text,)).fetchone()[0]

    def schedule(self, candidate_id: int, family: KernelFamily = GEMM):
        row = self.conn.execute("SELECT schedule, family FROM candidates WHERE id = ?", (candidate_id,)).fetchone()
        if row[1] != family.name:
            raise ShapeshiftError(f"tuning database {self.path}: candidate {candidate_id} is a {row[1]!r} schedule, "
                                  f"measured for a {family.name!r} task (a damaged database)")
        return family.from_json(row[0])

    def _here(self) -> tuple[str, str]:
        """This CPU's target key, and the key of measurements from an unknown CPU."""
        return self.target_key, UNKNOWN_TARGET

    def add_measurements(self, workload_id: int, candidate_id: int, threads: int,
                         seconds: dict[int, float], error: Optional[str] = None, ms=(),
                         machine: Optional[dict] = None) -> None:
        """Seconds per M, or (with ``error``) a failure recorded at every M of ``ms``, made on this
        CPU model; ``machine``: the machine that made them (tune/machine.py), kept in ``machines``."""
        now, here = time.time(), self.target_key
        with self._tx():
            mid = self._machine_id(machine) if machine else None
            rows = ([(workload_id, candidate_id, m, threads, None, error, now, here, mid) for m in ms] if error else
                    [(workload_id, candidate_id, m, threads, s, None, now, here, mid) for m, s in seconds.items()])
            self.conn.executemany("INSERT OR IGNORE INTO measurements (workload_id, candidate_id, m, threads, "
                                  "seconds, error, created, target, machine) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                  rows)

    def _machine_id(self, machine: dict) -> int:
        from .machine import machine_text

        text = machine_text(machine)
        self.conn.execute("INSERT OR IGNORE INTO machines (target, description) VALUES (?, ?)",
                          (machine.get("target_key", ""), text))
        return self.conn.execute("SELECT id FROM machines WHERE description = ?", (text,)).fetchone()[0]

    def machines(self, workload_id: int) -> list[tuple[dict, int]]:
        """Every machine that measured the workload, with how many measurements it made."""
        rows = self.conn.execute("SELECT m.description, COUNT(*) FROM measurements r JOIN machines m ON m.id = "
                                 "r.machine WHERE r.workload_id = ? GROUP BY m.id ORDER BY m.id",
                                 (workload_id,)).fetchall()
        return [(json.loads(text), n) for text, n in rows]

    def measurements(self, workload_id: int, threads: int) -> list[tuple[int, int, Optional[float], Optional[str]]]:
        """(candidate_id, M, seconds, error) of every measurement of the workload made on this
        CPU (or on an unknown one, listed first so that this CPU's own replace them)."""
        return self.conn.execute(
            "SELECT candidate_id, m, seconds, error FROM measurements WHERE workload_id = ? AND threads = ? "
            "AND target IN (?, ?) ORDER BY target = ? DESC, candidate_id, m",
            (workload_id, threads, *self._here(), UNKNOWN_TARGET)).fetchall()

    def unknown_cpu_measurements(self, workload_id: int, threads: int) -> int:
        """How many of the workload's measurements were made before measurements named their CPU."""
        return self.conn.execute("SELECT COUNT(*) FROM measurements WHERE workload_id = ? AND threads = ? "
                                 "AND target = ?", (workload_id, threads, UNKNOWN_TARGET)).fetchone()[0]

    def measured_ms(self, workload_id: int, candidate_id: int, threads: int) -> set[int]:
        rows = self.conn.execute("SELECT m FROM measurements WHERE workload_id = ? AND candidate_id = ? AND threads = ? "
                                 "AND target IN (?, ?)", (workload_id, candidate_id, threads, *self._here())).fetchall()
        return {r[0] for r in rows}

    def failed_candidates(self, workload_id: int, threads: int) -> set[int]:
        rows = self.conn.execute("SELECT DISTINCT candidate_id FROM measurements WHERE workload_id = ? "
                                 "AND threads = ? AND error IS NOT NULL AND target IN (?, ?)",
                                 (workload_id, threads, *self._here())).fetchall()
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
