"""Atomic file writes: a crash or an error never leaves a half-written artifact.

Every write goes to a temp file (or folder) beside its destination and is renamed over it
when complete. Inside `committed_together` (every stage's entry point) the renames wait for
the end of the block, so a stage's outputs all come from one run, or none is replaced. Temp
files get the permissions of a plain file (umask applied), and one left by a killed writer
is removed by the next write of the same destination.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

_pending: list[tuple[Path, Path]] | None = None  # (temp, destination), while a block commits together


@contextmanager
def committed_together(keep_on: type[BaseException] | tuple = (), installed: list | None = None):
    """Stage every write in the block; install them all when it ends, or when it raises one of
    `keep_on` (a gate's verdict is an output too); any other exception discards them all.
    The destinations installed are appended to `installed`."""
    global _pending
    _pending = []
    try:
        yield
    except keep_on:
        _install_pending(installed)
        raise
    except BaseException:
        for tmp, _ in _pending:
            _remove(tmp)
        raise
    else:
        _install_pending(installed)
    finally:
        _pending = None


def written(path: str | Path) -> Path:
    """Where `path`'s latest content is: its staged temp inside `committed_together`, else itself."""
    path = Path(path)
    return next((tmp for tmp, dest in reversed(_pending or []) if dest == path), path)


def _install_pending(installed: list | None) -> None:
    for tmp, dest in _pending:
        _install(tmp, dest)
        if installed is not None:
            installed.append(dest)
    _pending.clear()


def _install(tmp: Path, dest: Path) -> None:
    if tmp.is_dir() and dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _temp_beside(path: Path, directory: bool = False) -> Path:
    """A fresh temp file (or folder) beside `path`, with plain permissions; the temps of an
    earlier writer of `path` that never finished (killed) are removed, and so is a temp of
    this block's earlier write of it (the later write wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if _pending is not None:
        for tmp, dest in [p for p in _pending if p[1] == path]:
            _pending.remove((tmp, dest))
    for stale in path.parent.glob(f".{path.name}.*"):
        _remove(stale)
    umask = os.umask(0)
    os.umask(umask)
    if directory:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
        tmp.chmod(0o777 & ~umask)
    else:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.close(fd)
        tmp = Path(name)
        tmp.chmod(0o666 & ~umask)
    return tmp


def _finish(tmp: Path, path: Path) -> None:
    if _pending is None:
        _install(tmp, path)
    else:
        _pending.append((tmp, path))


@contextmanager
def atomic_writer(path: str | Path):
    """Open a temp file beside `path`; it replaces `path` only if the block succeeds."""
    path = Path(path)
    tmp = _temp_beside(path)
    try:
        with open(tmp, "w") as f:
            yield f
        _finish(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    n = 0
    with atomic_writer(path) as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")  # key order kept: responses exactly as returned
            n += 1
    return n


class DataError(ValueError):
    """A data file is unreadable: the message names the file and the line."""


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """Strict reader of UTF-8 JSON lines: a broken line raises DataError naming file and line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                yield json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                raise DataError(f"{path}:{lineno}: not UTF-8 text ({err.reason} at byte {err.start} of the line)") from None
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None


def write_json(path: str | Path, obj) -> None:
    with atomic_writer(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def write_timings(stage: str, values: dict) -> None:
    """Wall-clock figures of a stage run (`timings/<stage>.json`, `stage` as DVC names it). They
    stay out of the git-tracked metrics, which a rerun reproducing the same models must leave
    unchanged; the flow logs them to the stage's MLflow run."""
    write_json(Path("timings") / f"{stage}.json", values)


def write_text(path: str | Path, text: str) -> None:
    with atomic_writer(path) as f:
        f.write(text)


@contextmanager
def atomic_dir(path: str | Path):
    """Yield a temp directory beside `path`; it replaces `path` only if the block succeeds."""
    path = Path(path)
    tmp = _temp_beside(path, directory=True)
    try:
        yield tmp
        _finish(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def write_csv(path: str | Path, rows: list[dict], fields: list[str] | None = None) -> None:
    """Rows as CSV; `fields` names the columns (else the first row's keys): an empty curve keeps its header."""
    import csv

    with atomic_writer(path) as f:
        fields = fields or (list(rows[0]) if rows else [])
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def folder_digest(folder: str | Path) -> str:
    """sha256 over the relative path and bytes of every file in `folder` (Python's caches aside)."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()
