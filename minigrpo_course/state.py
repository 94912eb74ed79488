"""A learner's state on disk (grades, interview progress): JSON files that are never half-written, never
lose a concurrent update, and are never overwritten when they cannot be read.

    from minigrpo_course.state import StateFileError, read_json, update_json

    update_json(path, lambda data: {**data, "01": grade}, what="grades")   # read, change, write: one locked step
    data = read_json(path, what="grades")                                   # {} when the file does not exist yet

- Every write is atomic: a unique temporary file in the same folder, flushed and fsynced, then ``os.replace``
  (a crash or kill -9 leaves either the old file or the new one, never a mix).
- :func:`update_json` holds an exclusive ``fcntl.flock`` on a lock file beside the state file
  (``grades.json.lock``) from the read to the replace, so two processes that update the file at once both keep
  their change (each reads what the other wrote). Readers need no lock.
- A file that cannot be parsed (or whose content ``check`` refuses) raises :class:`UnreadableStateFile` with one
  line naming the file and saying what to do; :func:`update_json` then writes nothing, so what the learner had
  is kept. A write that fails (a read-only home) raises :class:`UnwritableStateFile`, also one line.
- Learner files that are not JSON state (an executed notebook, a mock round's transcript) are written with the same
  all-or-nothing :func:`atomic_write_text`. :func:`check_writable` asks, before a run or a session starts, whether
  a path can be written; :func:`keep_elsewhere` puts the learner's text in the temporary folder when it cannot.

Standard library only: reading a learner's state never imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# ``path.write_text(text)``, all or nothing (a unique temporary file, fsynced, renamed): for any learner file
# that is not JSON state, such as an executed notebook, a mock round's transcript, a coding drill's blank page
from minigrpo.infra.atomic import atomic_write_text

try:
    import fcntl
except ImportError:  # Windows: no flock; updates are still atomic, only not merged under a lock
    fcntl = None


class StateFileError(Exception):
    """A state file that cannot be read or written; ``str()`` is one line naming the file."""

    def __init__(self, path: Path, message: str):
        super().__init__(message)
        self.path = Path(path)


class UnreadableStateFile(StateFileError):
    """The file exists but is not valid JSON of the expected shape. It is left exactly as it is."""


class UnwritableStateFile(StateFileError):
    """The file (or its lock, or its folder) could not be written: a read-only home, a full disk, ..."""


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return getattr(exc, "strerror", None) or text


def read_json(path: Path | str, what: str = "data", default: Callable[[], Any] = dict,
              check: Callable[[Any], None] | None = None) -> Any:
    """The parsed content of ``path`` (``default()`` when it does not exist).

    ``check(data)`` may raise ValueError/TypeError for content of the wrong shape. Raises
    :class:`UnreadableStateFile` (one line: the file, what is wrong, what to do) for a file that cannot be
    read or parsed, or that ``check`` refuses.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return default()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableStateFile(path, f"cannot read {path} ({_reason(exc)}); fix its permissions or move it "
                                        f"away; your {what} there are kept") from None
    try:
        data = json.loads(text)
        if check is not None:
            check(data)
    except json.JSONDecodeError as exc:
        raise UnreadableStateFile(path, f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}); fix it or move "
                                        f"it away; your {what} there are kept and nothing is written to it until "
                                        f"then") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UnreadableStateFile(path, f"{path} does not hold {what} in the expected format ({_reason(exc)}); fix "
                                        f"it or move it away; nothing is written to it until then") from None
    return data


def write_json(path: Path | str, data: Any, what: str = "data") -> None:
    """Write ``data`` as JSON atomically (:func:`atomic_write_text`). Raises :class:`UnwritableStateFile` (one
    line) when it cannot; the old file is then untouched."""
    path = Path(path)
    text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        raise UnwritableStateFile(path, f"could not save your {what} to {path} ({_reason(exc)})") from None


def lock_path(path: Path | str) -> Path:
    """The lock file beside a state file: ``grades.json`` → ``grades.json.lock``."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def locked(path: Path | str, what: str = "data") -> Iterator[None]:
    """Hold an exclusive lock for ``path`` (blocking) while the block runs."""
    path = Path(path)
    if fcntl is None:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UnwritableStateFile(path, f"could not save your {what} to {path} ({_reason(exc)})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


def update_json(path: Path | str, change: Callable[[Any], Any], what: str = "data",
                default: Callable[[], Any] = dict, check: Callable[[Any], None] | None = None) -> Any:
    """Read ``path``, apply ``change`` (it returns the new content; it may edit its argument), and write the result
    atomically, all under the file's lock, so that concurrent updates from other processes are merged, not lost.
    Returns the new content. Raises :class:`UnreadableStateFile` without writing anything when the current file
    cannot be read, and :class:`UnwritableStateFile` when the new one cannot be written."""
    with locked(path, what):
        new = change(read_json(path, what, default, check))
        write_json(path, new, what)
    return new


def check_writable(path: Path | str, what: str = "file") -> Path:
    """``path`` if a file can be written there; else a ``ValueError`` of one sentence saying why (it is a folder,
    a file stands where one of its folders should be, the folder is read-only). Asked before a run or a session
    starts, so that a bad path costs one sentence up front rather than the work at the end. Creates the missing
    folders, and a test file that it removes."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(f"the {what} path {path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
        os.close(fd)
        os.unlink(name)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"cannot write the {what} {path}: a file stands where a folder of that path should be") \
            from None
    except OSError as exc:
        raise ValueError(f"cannot write the {what} {path}: {_reason(exc)}") from None
    return path


def keep_elsewhere(text: str, stem: str) -> Path | None:
    """When the real file cannot be written: ``text`` in a new file of the temporary folder
    (``minigrpo-STEM-YYYYmmdd-HHMMSS-*.md``), whose path the caller names to the learner; None when even that
    fails (the caller then prints the text back)."""
    try:
        fd, name = tempfile.mkstemp(prefix=f"minigrpo-{stem}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".md")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        return Path(name)
    except OSError:
        return None


__all__ = ["StateFileError", "UnreadableStateFile", "UnwritableStateFile", "atomic_write_text", "check_writable",
           "keep_elsewhere", "lock_path", "locked", "read_json", "update_json", "write_json"]
