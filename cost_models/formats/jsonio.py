"""Reading and atomically writing JSON documents (plans, profiles, measurements).

Writes go to a temporary file in the target's directory, are flushed and
fsync'ed, then renamed over the target, so a reader never sees half a file and
a crash leaves the old file intact. Reads turn every way a file can be unusable
(missing, unreadable, not JSON) into one :class:`InputError` line.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cost_models.errors import InputError

__all__ = ["emit_document", "read_json", "write_bytes_atomic", "write_json_atomic"]


def write_json_atomic(path: str | os.PathLike[str], document: object) -> Path:
    """Write ``document`` as indented JSON to ``path`` atomically.

    Args:
        path: Destination file; its directory must exist.
        document: Anything ``json.dumps`` accepts.

    Returns:
        The destination as a ``Path``.

    Raises:
        InputError: The directory does not exist or is not writable.
    """
    text = json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    return write_bytes_atomic(path, text.encode("utf-8"))


def emit_document(document: object, out: str | None, as_json: bool, show: Callable[[Any], None]) -> None:
    """A command's result: written atomically to ``out`` when given, then printed as JSON or shown by ``show``."""
    if out:
        write_json_atomic(out, document)
    if as_json:
        json.dump(document, sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        show(document)


def check_writable(path: str | os.PathLike[str] | None, option: str) -> None:
    """Refuse, before any work, an output ``path`` that is a folder or whose folder does not exist.

    Raises:
        InputError: Naming ``option`` (e.g. ``--out``) and the missing folder.
    """
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise InputError(f"{option} {path} is a folder; give a file name")
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{option} {path}: folder {directory} does not exist; create it first")


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (a temporary file in the same directory, fsync, rename).

    Raises:
        InputError: The directory does not exist or is not writable.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"cannot write {target}: directory {directory} does not exist; create it first")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as err:
        raise InputError(f"cannot write {target}: {err.strerror}; choose a writable location") from err
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    return target


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """Read a JSON document, turning every failure into one clear line.

    Args:
        path: File to read.
        what: What the file should be ("plan", "profile"), used in messages.

    Raises:
        InputError: Missing, unreadable, or not valid JSON (with line and column).
    """
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise InputError(f"{what} file {source} does not exist; check the path") from err
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read {what} file {source}: {err}") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"{what} file {source} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
            f"re-create it with parplan"
        ) from err
