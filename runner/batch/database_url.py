"""Which database holds the batch queue, said safely: a ``--db`` URL, ``$LEANVIDEO_DB`` or the
workspace's SQLite file, checked before it is opened, and its password starred out in every message.

Example::

    url = resolve_db_url(None, Path(".workspace"))   # sqlite:////…/.workspace/batch.sqlite
    redact_db_url("postgresql://lv:secret@db/q")     # 'postgresql://lv:***@db/q'
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

from runner.errors import UsageError, WorkspaceError

__all__ = [
    "DB_ENV",
    "DEFAULT_DB_NAME",
    "database_error_text",
    "redact_db_url",
    "resolve_db_url",
    "sqlite_file",
    "sqlite_problem",
    "with_connect_timeout",
]

DB_ENV = "LEANVIDEO_DB"
DEFAULT_DB_NAME = "batch.sqlite"


POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")
CONNECT_TIMEOUT_S = 10  # a database host that takes connections in silence held a command 4.5 minutes


def resolve_db_url(given: str | None, workspace_root: Path) -> str:
    """``given``, else ``$LEANVIDEO_DB``, else a SQLite file in the workspace."""
    url = given or os.environ.get(DB_ENV) or f"sqlite:///{(workspace_root / DEFAULT_DB_NAME).resolve()}"
    where = "--db" if given else f"${DB_ENV}"
    if not url.startswith(("sqlite:///", *POSTGRES_SCHEMES)):
        raise UsageError(
            f"{where} {redact_db_url(url)!r}: expected sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
        )
    if url.startswith(POSTGRES_SCHEMES) and not urlsplit(url).path.strip("/"):
        raise UsageError(  # DBOS said "Database name must be specified" as an error of its own (exit 1)
            f"{where} {redact_db_url(url)!r} names no database: postgresql://USER@HOST:PORT/DB"
        )
    database = sqlite_file(url)
    if database is not None and (problem := sqlite_problem()) is not None:
        raise WorkspaceError(f"{where} {url!r}: {problem}")
    named = given or os.environ.get(DB_ENV)  # the workspace's own is made with the workspace
    if named and database is not None and not database.parent.is_dir():  # a typo: a queue no one reads
        raise UsageError(
            f"{where} {url!r}: the folder {database.parent} does not exist (sqlite:///relative/file.sqlite, "
            "sqlite:////absolute/file.sqlite)"
        )
    return url


# DBOS stamps a SQLite queue's rows with unixepoch('subsec') under Python 3.12+, which SQLite has from 3.42
SUBSEC_SQLITE = (3, 42, 0)


def sqlite_problem(
    python: tuple[int, ...] = sys.version_info[:3], sqlite: str = sqlite3.sqlite_version
) -> str | None:
    """Why this Python cannot keep the queue in SQLite (every insert failed with ``NOT NULL constraint
    failed: workflow_status.created_at``), or None."""
    linked = tuple(int(part) for part in sqlite.split(".")[:3])
    if python[:2] < (3, 12) or linked >= SUBSEC_SQLITE:
        return None
    return (
        f"a batch queue in SQLite needs SQLite 3.42 or newer under Python 3.12 and later (DBOS stamps its "
        f"rows with unixepoch('subsec')); this Python ({'.'.join(map(str, python[:3]))}) links SQLite "
        f"{sqlite}: install LeanVideo with Python 3.11 (python3.11 install.py), or keep the queue in "
        "PostgreSQL (--db postgresql://USER@HOST:PORT/DB)"
    )


def sqlite_file(db_url: str) -> Path | None:
    """The database file of a ``sqlite:///PATH[?options]`` URL; None for another database."""
    if not db_url.startswith("sqlite:///"):
        return None
    return Path(db_url.removeprefix("sqlite:///").partition("?")[0])


def with_connect_timeout(url: str) -> str:
    """``url`` as it is opened: a PostgreSQL one gives up connecting after :data:`CONNECT_TIMEOUT_S`
    unless it says otherwise (``?connect_timeout=S``, as libpq reads it); without it a host that takes
    connections and answers nothing held a command for minutes."""
    parts = urlsplit(url)
    if not url.startswith(POSTGRES_SCHEMES) or "connect_timeout" in parse_qs(parts.query):
        return url
    query = f"{parts.query}&" if parts.query else ""
    return urlunsplit(parts._replace(query=f"{query}connect_timeout={CONNECT_TIMEOUT_S}"))


def database_error_text(error: BaseException) -> str:
    """What a database error says, on one line: psycopg's message and hint, without SQLAlchemy's
    statement, parameters and "Background on this error" link."""
    said = " ".join(
        line.strip()
        for line in str(error).splitlines()
        if line.strip() and not line.startswith(("(Background on this error", "[SQL:", "[parameters:"))
    )
    return said or type(error).__name__


def redact_db_url(url: str) -> str:
    """``url`` with its password starred out, for messages: in the user part (``user:secret@``) and as a
    connection parameter (``?password=secret``, libpq's name for it)."""
    url = re.sub(r"://([^:@/]+):[^@/]*@", r"://\1:***@", url)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)
