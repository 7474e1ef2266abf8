"""Cache entries on disk, shared by the trace cache (Parquet) and the analysis cache (Arrow
IPC + JSON): data formats only, never pickle, so a planted or damaged entry can at worst
be rejected, never run.

An entry is a folder of files plus `manifest.json` naming each file with its size and
SHA-256. It is written into a temporary folder and renamed into place, so a reader sees a
whole entry or none; on read every file is checked against the manifest, and an entry that
fails (damaged, partial, edited, of another format) is removed so that the caller rebuilds
it. Temporary folders carry the writer's process id: leftovers of a killed run are removed
by the next run once that process is gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

MANIFEST = "manifest.json"
#: Prefixes of in-flight folders: a writer's temporary entry, a run's work folder, an entry
#: being removed. Each is followed by the owner's pid.
TEMP_PREFIXES = (".tmp-", ".work-", ".trash-")
#: A leftover whose owner cannot be checked (another host sharing the cache) is removed
#: after this long.
STALE_S = 24 * 3600


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def temp_name(prefix: str, tag: str = "") -> str:
    return f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}" + (f"-{tag}" if tag else "")


def write_entry(folder: Path, writers: dict[str, Callable[[Path], None]], meta: dict[str, Any], fmt: int,
                detach: bool = True) -> bool:
    """Write an entry atomically: each `writers[name](path)` writes one file. False when the
    entry could not be written (the cache is then just not used for it). Within
    `detached.writes_detached()` the entry is queued for a detached writer instead (True)."""
    if detach:
        from k3trace.ingest import detached

        if detached.queue(folder, writers, meta, fmt):
            return True
    tmp = folder.parent / temp_name(".tmp-", folder.name)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(folder.parent)
        tmp.mkdir()

        def written(name: str) -> dict[str, Any]:
            writers[name](tmp / name)
            return {"bytes": (tmp / name).stat().st_size, "sha256": _digest(tmp / name)}

        # Two at a time: the large frames' writers and digests release the GIL, and an
        # analysis entry's two largest files take as long as all the others.
        with ThreadPoolExecutor(2) as pool:
            files = dict(zip(writers, pool.map(written, writers)))
        (tmp / MANIFEST).write_text(json.dumps({"format": fmt, "files": files, "meta": meta}))
        try:
            os.rename(tmp, folder)
        except OSError:
            pass  # written by another process first: keep theirs
        return True
    except OSError:
        return False
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_entry(folder: Path, fmt: int) -> dict[str, Any] | None:
    """The manifest of a whole, undamaged entry of format `fmt` (its `meta` and `files`), or
    None: absent, or damaged and now removed."""
    manifest = folder / MANIFEST
    if not folder.is_dir():
        return None
    try:
        data = json.loads(manifest.read_text())
        files = data["files"]
        ok = data["format"] == fmt and isinstance(files, dict) and isinstance(data["meta"], dict)
        for name, info in files.items():
            path = folder / name
            if Path(name).name != name or not path.is_file():
                ok = False
                break
            if path.stat().st_size != info["bytes"] or _digest(path) != info["sha256"]:
                ok = False
                break
        # Files the manifest does not name (a planted file) make the entry suspect too.
        if ok and {p.name for p in folder.iterdir()} != set(files) | {MANIFEST}:
            ok = False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        discard(folder)
        return None
    return data


def discard(folder: Path) -> None:
    """Remove a damaged entry so it can be rebuilt (renamed away first: a reader never sees
    it half removed)."""
    trash = folder.parent / temp_name(".trash-", folder.name)
    try:
        os.rename(folder, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _owner_gone(name: str) -> bool:
    for prefix in TEMP_PREFIXES:
        if name.startswith(prefix):
            pid = name[len(prefix):].split("-", 1)[0]
            if not pid.isdigit():
                return True
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return True
            except OSError:
                return False  # alive, another user's
            return False
    return False


def clean_leftovers(root: Path) -> int:
    """Remove in-flight folders left in `root` by runs that were killed. Returns how many."""
    removed = 0
    try:
        entries = list(root.iterdir())
    except OSError:
        return 0
    now = time.time()
    for path in entries:
        name = path.name
        if not name.startswith(TEMP_PREFIXES):
            continue
        try:
            stale = now - path.lstat().st_mtime > STALE_S
        except OSError:
            continue
        if stale or _owner_gone(name):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed += 1
    return removed


def unusable(cache_dir: Path) -> str | None:
    """Why `cache_dir` cannot hold a cache (None when it can): it must be, or become, a
    folder k3trace can write in."""
    try:
        if cache_dir.exists() and not cache_dir.is_dir():
            return "it is not a folder"
        cache_dir.mkdir(parents=True, exist_ok=True)
        probe = cache_dir / temp_name(".tmp-", "probe")
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None
