"""Writes that are all or nothing: a crash (kill -9, a full disk, a power cut) leaves the old file or
folder, or the new one, never half of one.

The usual recipe: write everything under a temporary name next to the target (the same folder, so the
same file system), ``fsync`` it, ``os.replace`` it onto the target (an atomic rename), then ``fsync``
the parent folder so that the rename itself is on disk.

- :func:`atomic_write_text` / :func:`atomic_write_json` / :func:`atomic_torch_save`: one file.
- :func:`atomic_folder`: a whole folder (a checkpoint): ``with atomic_folder(target) as tmp:`` write
  into ``tmp``; leaving the block puts it in ``target``'s place. An exception inside the block removes
  ``tmp`` and leaves ``target`` as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def fsync_path(path: str | Path) -> None:
    """Flush a file, or every file under a folder and the folders themselves, to disk."""
    path = Path(path)
    if path.is_dir():
        for child in path.iterdir():
            fsync_path(child)
    _fsync(path)


def _usual_permissions(path: Path) -> None:
    """What a plain open()/mkdir() would have given (mkstemp/mkdtemp make private 0600/0700 entries)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _fsync(path: Path) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:  # a platform that cannot open folders (Windows): the rename is the best it offers
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def _temporary_file(path: Path) -> Iterator[Path]:
    """A unique temporary name next to ``path`` (two writers never share it); removed if the block fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _usual_permissions(tmp)
        fsync_path(tmp)
        os.replace(tmp, path)
        _fsync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """``path.write_text(text)``, all or nothing."""
    path = Path(path)
    with _temporary_file(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return path


def atomic_write_json(path: str | Path, obj: Any, **dumps_kwargs: Any) -> Path:
    """``obj`` as JSON (``json.dumps(obj, **dumps_kwargs)``), all or nothing."""
    return atomic_write_text(path, json.dumps(obj, **dumps_kwargs))


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj, path)``, all or nothing."""
    import torch

    path = Path(path)
    with _temporary_file(path) as tmp:
        torch.save(obj, tmp)
    return path


@contextmanager
def atomic_folder(target: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder next to ``target``; when the block ends, put it in ``target``'s place.

    An existing ``target`` is first renamed aside and removed only once the new folder is in place
    (POSIX cannot rename a folder onto a non-empty one), so at every moment ``target`` is the old
    folder, the new one, or briefly absent (a reader that finds none falls back, as resuming does),
    never a mix of both.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        _usual_permissions(tmp)
        fsync_path(tmp)
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            os.replace(target, old / target.name)
        os.replace(tmp, target)
        _fsync(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["atomic_folder", "atomic_torch_save", "atomic_write_json", "atomic_write_text", "fsync_path"]
