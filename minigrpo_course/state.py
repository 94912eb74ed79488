"""A learner's files on disk: writes that are all or nothing, and read-merge-writes that several processes share.

Everything the course keeps for a learner (grades, interview progress, mock transcripts) goes through here:

- :func:`atomic_write_text` / :func:`atomic_write_json`: write a unique temporary file in the target's folder
  (two writers never share a name), ``fsync`` it, ``os.replace`` it onto the target, ``fsync`` the folder. A
  crash or ``kill -9`` leaves the old file or the new one, never half of one.
- :func:`locked`: an exclusive ``fcntl.flock`` on a lock file beside the target (``.NAME.lock``), held for a
  read-merge-write. Two terminals recording at once then run one after the other instead of the last one
  overwriting the other's update. Where ``fcntl`` is missing (Windows) the block runs unlocked.
- :func:`update_json`: both together: under the lock, read the file (``None`` if it does not exist), let a
  function merge the change into it, write the result atomically.
- :func:`check_writable`: would a file at this path be writable? Asked before a long run or a session starts,
  so a bad path is one sentence up front rather than lost work at the end.
- :func:`keep_elsewhere`: when the real file cannot be written, put the learner's text in a temporary folder and
  say where.

Standard library only: ``minigrpo list`` and ``minigrpo interview`` must not import torch.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no flock; the writes stay atomic, the merge is unlocked
    fcntl = None


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a platform that cannot open folders: the rename is the best it offers
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """``path.write_text(text)``, all or nothing; an ``OSError`` (read-only folder, full disk) leaves ``path`` as
    it was and no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(name, 0o666 & ~umask)  # mkstemp makes 0600; a plain open() would not
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def atomic_write_json(path: str | Path, obj: Any, **dumps_kwargs: Any) -> Path:
    """``obj`` as JSON (``json.dumps(obj, **dumps_kwargs)``), all or nothing."""
    return atomic_write_text(path, json.dumps(obj, **dumps_kwargs) + "\n")


def lock_path(path: str | Path) -> Path:
    """The lock file of ``path``: ``.NAME.lock`` in the same folder."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold the exclusive lock of ``path`` for the block (waits for another process holding it)."""
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_json(path: str | Path) -> Any:
    """The JSON in ``path``, or None if there is no file. ``ValueError`` for a file that is not JSON or not text
    (the caller names it and says what to do; it is never overwritten)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return json.loads(text)


def update_json(path: str | Path, merge: Callable[[Any], Any], *, read: Callable[[Path], Any] = read_json,
                **dumps_kwargs: Any) -> Any:
    """Under the lock of ``path``: ``new = merge(read(path))``, then write ``new`` atomically; returns ``new``.

    ``read`` gets the path and returns its content (None when there is no file); it raises for a file it cannot
    understand, and then nothing is written. ``merge`` must add the caller's change to what another process may
    have written since the caller last read the file, not replace it.
    """
    path = Path(path)
    with locked(path):
        new = merge(read(path))
        atomic_write_json(path, new, **dumps_kwargs)
    return new


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_writable(path: str | Path, what: str = "file") -> Path:
    """``path`` if a file can be written there; else a ``ValueError`` of one sentence saying why (its folder is a
    file, it is a folder, the folder is read-only). Creates the missing folders, and a test file it removes."""
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
    """Write ``text`` to a new file in the temporary folder (``minigrpo-STEM-YYYYmmdd-HHMMSS-*.md``) and return it;
    None when even that fails (the caller then prints the text back)."""
    try:
        fd, name = tempfile.mkstemp(prefix=f"minigrpo-{stem}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".md")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        return Path(name)
    except OSError:
        return None


__all__ = ["atomic_write_json", "atomic_write_text", "check_writable", "keep_elsewhere", "lock_path", "locked",
           "read_json", "update_json"]
