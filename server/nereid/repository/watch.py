"""Poll mode's change detector: fingerprints of model folders, and the rule that decides
when a change in the repository is acted upon.

Owns "what changed, and is it safe to act on it yet". Only the two ``fingerprint_*``
functions touch the filesystem (callers run them off the event loop); ChangeDetector is
pure. Knows nothing about loading, asyncio or HTTP.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from nereid.repository.scan import RepositoryScan, list_model_names

__all__ = [
    "FileStamp",
    "Fingerprint",
    "Changes",
    "ChangeDetector",
    "is_ignored",
    "fingerprint_model",
    "fingerprint_repository",
    "fingerprint_scan",
]

#: Files up to this size are fingerprinted by content too, so an edit that keeps the
#: size and lands in the same mtime tick is still seen. Larger files (weights) go by
#: size and mtime only: hashing gigabytes on every poll would cost more than it finds.
CONTENT_HASH_LIMIT = 1 << 20

_SWAP_SUFFIXES = (".swp", ".swo", ".swx", "~", ".pyc")


def is_ignored(name: str) -> bool:
    """Whether a file or folder name inside a model folder is left out of fingerprints:
    ``__pycache__``, dotfiles and dot-folders (``.git``, ``.#model.py`` Emacs locks,
    ``.model.py.swp`` Vim swap files), editor leftovers (``*.swp``, ``*.swo``, ``*.swx``,
    ``*~``) and compiled ``*.pyc``. None of these changes what a model does, and most
    appear and vanish while someone edits a file."""
    return name == "__pycache__" or name.startswith(".") or name.endswith(_SWAP_SUFFIXES)


@dataclass(frozen=True, slots=True, order=True)
class FileStamp:
    """One file of a model folder as the fingerprint sees it. ``path`` is relative to the
    model folder, with ``/`` separators; ``digest`` is the SHA-1 of the content for files
    up to CONTENT_HASH_LIMIT bytes, else empty."""

    path: str
    size: int
    mtime_ns: int
    digest: str = ""


#: A model folder's fingerprint: its files' stamps, sorted by path. Two fingerprints are
#: equal exactly when no file that matters was added, removed or changed.
Fingerprint = tuple[FileStamp, ...]


def fingerprint_model(folder: Path) -> Fingerprint:
    """The fingerprint of one model folder (every file below it, recursively, except the
    ignored ones). Files that vanish while the folder is read are left out; a folder that
    does not exist has the empty fingerprint."""
    stamps: list[FileStamp] = []
    for dirpath, dirnames, filenames in os.walk(folder, onerror=lambda error: None):
        dirnames[:] = sorted(d for d in dirnames if not is_ignored(d))
        relative_dir = os.path.relpath(dirpath, folder)
        for filename in filenames:
            if is_ignored(filename):
                continue
            path = os.path.join(dirpath, filename)
            stamp = _stamp(path, filename if relative_dir == "." else f"{relative_dir}/{filename}")
            if stamp is not None:
                stamps.append(stamp)
    return tuple(sorted(stamps))


def fingerprint_repository(root: Path) -> dict[str, Fingerprint]:
    """Fingerprints of every model folder of the repository (the folders
    ``list_model_names`` finds), by model name."""
    return {name: fingerprint_model(root / name) for name in list_model_names(root)}


def fingerprint_scan(scan: RepositoryScan) -> dict[str, Fingerprint]:
    """Fingerprints of the models of several repositories (``scan_repositories``), by
    name; a name in several repositories is left out (no model, as in Triton)."""
    return {name: fingerprint_model(root / name) for name, root in scan.roots.items()}


def _stamp(path: str, relative: str) -> FileStamp | None:
    try:
        info = os.stat(path)
        digest = ""
        if info.st_size <= CONTENT_HASH_LIMIT:
            with open(path, "rb") as file:
                digest = hashlib.sha1(file.read(), usedforsecurity=False).hexdigest()
    except OSError:  # gone (or unreadable) between listing and reading: not there
        return None
    return FileStamp(relative.replace(os.sep, "/"), info.st_size, info.st_mtime_ns, digest)


@dataclass(frozen=True, slots=True)
class Changes:
    """What to do after one poll: models to load, to reload and to unload (names sorted)."""

    added: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.modified or self.removed)


class ChangeDetector:
    """Decides which models changed, once each change has held still.

    Built from the fingerprints the server acted on at start (``baseline``). ``observe``
    takes the fingerprints of one poll and reports a model as added, modified or removed
    only when its fingerprint differs from the one last acted on *and* equals the one
    seen at the previous poll: a folder must stop changing for one poll interval before
    anything happens, so a model being copied or saved in several writes is loaded once,
    complete. A folder that changes and changes back before that is never reported.
    """

    def __init__(self, baseline: Mapping[str, Fingerprint]) -> None:
        self._acted: dict[str, Fingerprint] = dict(baseline)
        self._last: dict[str, Fingerprint] = dict(baseline)

    @property
    def pending(self) -> tuple[str, ...]:
        """Models whose last observed fingerprint differs from the one acted on (changes
        seen but not yet stable), sorted."""
        names = set(self._acted) | set(self._last)
        return tuple(sorted(n for n in names if self._acted.get(n) != self._last.get(n)))

    def observe(self, current: Mapping[str, Fingerprint]) -> Changes:
        """Take one poll's fingerprints; return the changes that are now stable (and
        remember them as acted on)."""
        added: list[str] = []
        modified: list[str] = []
        removed: list[str] = []
        for name in sorted(set(self._acted) | set(self._last) | set(current)):
            now = current.get(name)
            if now == self._acted.get(name):
                continue  # nothing to do (it may have changed and changed back)
            if now != self._last.get(name):
                continue  # still changing: wait until it holds still for one interval
            if now is None:
                removed.append(name)
                del self._acted[name]
            else:
                (modified if name in self._acted else added).append(name)
                self._acted[name] = now
        self._last = dict(current)
        return Changes(tuple(added), tuple(modified), tuple(removed))
