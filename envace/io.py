"""Atomic file writes: a crash or an error never leaves a half-written artifact."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator


@contextmanager
def atomic_writer(path: str | Path):
    """Open a temp file beside `path`; rename it over `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    n = 0
    with atomic_writer(path) as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")  # key order kept: responses exactly as returned
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """Strict reader: a broken line raises, naming the file and the line."""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None


def write_json(path: str | Path, obj) -> None:
    with atomic_writer(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def write_text(path: str | Path, text: str) -> None:
    with atomic_writer(path) as f:
        f.write(text)


@contextmanager
def atomic_dir(path: str | Path):
    """Yield a temp directory beside `path`; it replaces `path` only if the block succeeds."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_csv(path: str | Path, rows: list[dict]) -> None:
    import csv

    with atomic_writer(path) as f:
        fields = list(rows[0]) if rows else []
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
