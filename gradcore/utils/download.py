"""Downloading a data or weights file once into a cache folder, checked by its SHA-256.

`fetch(name, urls, sha256)` gives the path of `name` in the cache folder ($GRADCORE_DATA, else
~/.gradcore). A file already there is checked and used; else the URLs (mirrors) are tried in
turn. A download goes to `name.part` and resumes from what a broken one left there (an HTTP
Range request; a server that ignores it sends the whole file again; a resumed file that comes
out wrong, or that the server will not resume (HTTP 416), is downloaded again whole); the
finished file is checked, then renamed into place at once, so a reader never sees half of it.
When every URL fails, the error lists why for each and says which file to put where by hand.
"""
import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["DownloadError", "cache_folder", "fetch"]

CHUNK = 1 << 16


class DownloadError(OSError):
    """No URL gave the file with the right SHA-256 (or the cached one is not right)."""


def cache_folder():
    """Where downloads go: $GRADCORE_DATA, else ~/.gradcore."""
    return Path(os.environ.get("GRADCORE_DATA") or Path.home() / ".gradcore")


def sha256_of(path):
    """The SHA-256 of the file at `path`, as 64 lower-case hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(name, urls, sha256, folder=None, progress=None, timeout=30):
    """The path of `name` in the cache folder, downloaded from the first of `urls` that gives
    it with this `sha256` if it is not there yet. `progress`: a stream for a progress line
    (stderr when None; False for none)."""
    folder = Path(folder) if folder is not None else cache_folder()
    path = folder / name
    if path.is_file():
        found = sha256_of(path)
        if found == sha256:
            return path
        raise DownloadError(f"{path} is there but its SHA-256 is {found}, not {sha256}: delete "
                            "it (a different or damaged file) and fetch again")
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    stream = sys.stderr if progress is None else progress
    failures = []
    for url in urls:
        failure = _attempt(url, partial, sha256, stream, timeout)
        if failure is None:
            os.replace(partial, path)
            return path
        failures.append(f"{url}: {failure}")
    tried = "".join(f"\n  {failure}" for failure in failures)
    try:  # where the file goes under any cache folder (GRADCORE_DATA)
        inside = f" as {path.relative_to(cache_folder()).as_posix()}"
    except ValueError:  # a folder of the caller's own: GRADCORE_DATA does not move it
        inside = None
    elsewhere = f" or set GRADCORE_DATA to a folder holding it{inside}" if inside else ""
    raise DownloadError(f"could not download {name}:{tried}\nOffline, put the file at {path} "
                        f"(SHA-256 {sha256}){elsewhere}")


def _attempt(url, partial, sha256, stream, timeout):
    """Download `url` into `partial` and check it: None when `partial` is then the file, else
    why not. A download that resumed after bytes already there and comes out wrong (those bytes
    were from elsewhere), or that the server will not resume (HTTP 416: the bytes there are
    all, or more than, it has), is started again from the first byte, once."""
    for again in (False, True):
        if again:
            partial.unlink(missing_ok=True)
        resumed = partial.is_file() and partial.stat().st_size > 0
        try:
            _download(url, partial, stream, timeout)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code == 416 and resumed:
                continue
            return getattr(e, "reason", None) or e
        except (OSError, http.client.HTTPException, ValueError) as e:  # the .part is kept
            return getattr(e, "reason", None) or e
        found = sha256_of(partial)
        if found == sha256:
            return None
        partial.unlink()
        if not resumed:
            return f"the file's SHA-256 is {found}, not {sha256}"


def _download(url, partial, stream, timeout):
    """`url` into `partial`, resuming after the bytes already there."""
    have = partial.stat().st_size if partial.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        resumed = have and response.status == 206
        total = response.headers.get("Content-Length")
        total = (int(total) + (have if resumed else 0)) if total else None
        done = have if resumed else 0
        with open(partial, "ab" if resumed else "wb") as f:
            for block in iter(lambda: response.read(CHUNK), b""):
                f.write(block)
                done += len(block)
                _show(stream, partial.name[:-5], done, total)
        if total is not None and done != total:
            raise OSError(f"the connection closed after {done} of {total} bytes")
    if stream:
        stream.write("\n")
        stream.flush()


def _show(stream, name, done, total):
    if not stream:
        return
    if total:
        filled = 30 * done // total
        line = f"{name}: [{'#' * filled}{'.' * (30 - filled)}] {done / total:4.0%}"
    else:
        line = f"{name}: {done / 2 ** 20:.1f} MiB"
    stream.write("\r" + line)
    stream.flush()
