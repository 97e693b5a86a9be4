"""Downloading a data or weights file once into a cache folder, checked by its SHA-256.

`fetch(name, urls, sha256)` gives the path of `name` in the cache folder ($GRADCORE_DATA, else
~/.gradcore). A file already there is checked and used; else the URLs (mirrors) are tried in
turn. A download goes to `name.part` and resumes from what a broken one left there (an HTTP
Range request; a server that ignores it sends the whole file again; a resumed file that comes
out wrong, or that the server will not resume (HTTP 416), is downloaded again whole); the
finished file is checked, then renamed into place at once, so a reader never sees half of it.
Processes fetching the same file at once (MPI ranks) take turns through a lock file,
`name.lock`: one downloads, the others then find the file there.
When every URL fails, the error lists why for each and says which file to put where by hand.
"""
import contextlib
import errno
import hashlib
import http.client
import os
import posixpath
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

__all__ = ["DownloadError", "cache_folder", "fetch", "sha256_folder", "url_file_name"]

CHUNK = 1 << 16


class DownloadError(OSError):
    """No URL gave the file with the right SHA-256 (or the cached one is not right)."""


# A relative GRADCORE_DATA, by its value, as the folder it named when first read: an os.chdir
# later in the process does not move the cache away from the files already downloaded
_relative_folders = {}


def cache_folder():
    """Where downloads go: $GRADCORE_DATA, else ~/.gradcore, as an absolute path. A "~" in
    GRADCORE_DATA is the home folder (a shell leaves it alone inside quotes), and a relative one
    is taken from the current folder the first time this process reads that value, so that
    later downloads go to the same place after an os.chdir."""
    folder = os.environ.get("GRADCORE_DATA")
    if not folder:
        return Path.home() / ".gradcore"
    path = Path(folder).expanduser()
    if path.is_absolute():
        return path
    return _relative_folders.setdefault(folder, path.absolute())


def sha256_folder(folder, sha256):
    """`folder` / the first 16 hex digits of `sha256`: where a file is kept by its SHA-256, a
    folder per checksum, so that two URLs ending in one name (model.npz) keep a file each."""
    return Path(folder) / _checked_sha256(sha256, "fetch")[:16]


def _nearest_existing(folder):
    """The nearest of `folder` and the folders above it that exists (a file in the way too)."""
    return next((part for part in (folder, *folder.parents)
                 if part.exists() or part.is_symlink()), None)


def url_file_name(url):
    """The last component of `url`'s path, unquoted ("model.npz"): the name a download of it
    is kept under; "" (or "." / "..") where the URL names no file."""
    return posixpath.basename(urllib.parse.unquote(urllib.parse.urlsplit(url).path))


def sha256_of(path):
    """The SHA-256 of the file at `path`, as 64 lower-case hex digits."""
    with open(path, "rb") as f:
        return sha256_of_file(f)


def sha256_of_file(f):
    """The SHA-256 of what the binary file object `f` holds from its start, as 64 lower-case hex
    digits: the bytes of the file it has open, even if its name now names another one. Leaves
    `f` at its end."""
    digest = hashlib.sha256()
    f.seek(0)
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _checked_sha256(sha256, caller="load"):
    """`sha256` stripped and in lower case, checked to be 64 hex digits (None stays None);
    `caller` names the function in the error (Module.load, unless told)."""
    if sha256 is None:
        return None
    digest = sha256.strip().lower() if isinstance(sha256, str) else None
    if digest is None or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        raise ValueError(f"{caller}: sha256 must be a SHA-256 as 64 hex digits (`sha256sum "
                         f"file`), got {sha256!r}")
    return digest


def fetch(name, urls, sha256, folder=None, progress=None, timeout=30):
    """The path of `name` in the cache folder, downloaded from the first of `urls` that gives
    it with this `sha256` (64 hex digits, either case) if it is not there yet. `progress`: a
    stream for a progress line (stderr when None or True; False for none). Safe to call from
    several processes at once: one downloads while the others wait for it. `urls`: a list (or
    any iterable) of URLs, or one URL as a str."""
    if isinstance(urls, str):
        urls = [urls]
    elif isinstance(urls, (bytes, bytearray)):
        raise TypeError(f"fetch({name!r}): urls must be a str URL or a list of them, got "
                        f"{type(urls).__name__} {urls!r}; decode it first (urls.decode())")
    if sha256 is None:
        raise ValueError("fetch: sha256 must be the file's SHA-256 as 64 hex digits, not None")
    sha256 = _checked_sha256(sha256, "fetch")
    stream = _progress_stream(progress)
    # "~" as in GRADCORE_DATA: the home folder, not a folder named "~" in the current one
    folder = Path(folder).expanduser() if folder is not None else cache_folder()
    path = folder / name
    if "\0" in str(path):  # no file name holds one: os calls would say "embedded null byte"
        raise ValueError(f"fetch: cannot keep {name!r} at {str(path)!r}: a file name or folder "
                         "cannot hold a null character (%00 in a URL); pass another name")
    if _cached(path, sha256):  # before the lock: a read-only cache folder still works
        return path
    if path.exists() and not path.is_file():  # refused now, not at the rename after a download
        raise DownloadError(f"cannot download {name} to {path}: a folder (or something else "
                            "that is not a file) is there; move it away, or download the file "
                            "under another name")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        existing = _nearest_existing(folder)
        if existing is not None and not existing.is_dir():
            fix = f"move away the file {existing}, which is where a folder must be"
        else:  # the nearest folder there is the one mkdir could not write into
            fix = f"make {existing} writable" if existing is not None else "fix the path"
        failed = f": {e.filename}" if e.filename else ""
        raise DownloadError(f"cannot download {name}: cannot create the folder {folder} "
                            f"({e.strerror}{failed}); {fix}, or set GRADCORE_DATA to a folder "
                            "that is writable") from None
    with _locked(path, stream):
        if _cached(path, sha256):  # another process downloaded it while this one waited
            return path
        partial = path.with_name(path.name + ".part")
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


def _progress_stream(progress):
    """Where fetch shows its progress: a stream, or None for nowhere."""
    if progress is None or progress is True:  # True: PyTorch's spelling (progress=True)
        return sys.stderr
    if progress is False:
        return None
    if not callable(getattr(progress, "write", None)):
        raise TypeError(f"fetch: progress must be a stream (with a write method), True or None "
                        f"for stderr, or False for none; got {type(progress).__name__} "
                        f"{progress!r}")
    return progress


def _cached(path, sha256):
    """True if the file at `path` is there with this `sha256`, False if it is not there;
    DownloadError if another file is."""
    if not path.is_file():
        return False
    found = sha256_of(path)
    if found == sha256:
        return True
    raise DownloadError(f"{path} is there but its SHA-256 is {found}, not {sha256}: delete "
                        "it (a different or damaged file) and fetch again")


@contextlib.contextmanager
def _locked(path, stream):
    """Hold an exclusive lock on `path` + ".lock" (created if missing) against other
    processes; says on `stream` when it waits for one. The lock file is removed on release."""
    lock = path.with_name(path.name + ".lock")
    while True:
        fd = _open_lock(lock, path.name)
        try:
            if not _try_lock(fd):
                if stream is not None:
                    stream.write(f"{path.name}: another process is downloading it; waiting\n")
                    stream.flush()
                _lock(fd)
            try:  # the holder before us removes the file: then lock the one now there
                current = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if fcntl is not None:  # removed while held: a waiter on it then sees it gone
                os.unlink(lock)
            else:  # Windows cannot remove an open file; its lock must be undone before close
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        os.close(fd)  # releases the lock


def _open_lock(lock, name):
    """A descriptor of the lock file `lock`, created if missing. One there that this user may
    not write (another user's download made it, with umask 022) is opened read-only: flock and
    msvcrt.locking need no more."""
    for _ in range(2):  # twice: the file can go (its holder done) between the two opens
        try:
            return os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError as e:
            refused = e
        except OSError as e:
            refused = e
            break
        try:
            return os.open(lock, os.O_RDONLY)
        except FileNotFoundError:  # not there: creating it was refused (or its holder removed it)
            continue
        except OSError as e:
            raise DownloadError(e.errno, f"cannot download {name}: the lock file {lock} is there "
                                f"but this user can neither write nor read it ({e.strerror}); "
                                "another user's download made it? Remove it once no download "
                                "of the file is running, or set GRADCORE_DATA to a folder of "
                                "your own") from None
    raise DownloadError(refused.errno, f"cannot download {name}: cannot create {lock} "
                        f"({refused.strerror}); make the folder writable, or set GRADCORE_DATA "
                        "to a folder that is")


def _try_lock(fd):
    """Lock `fd` at once if no other process holds it: True, else False."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
            return False
        raise
    return True


def _lock(fd):
    """Lock `fd`, waiting as long as another process holds it (a download can take hours)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    while True:  # msvcrt's LK_LOCK gives up after 10 tries a second apart
        try:
            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
            return
        except OSError as e:
            if e.errno != errno.EDEADLK:
                raise


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
            headers = _download(url, partial, stream, timeout)
            found = sha256_of(partial)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code == 416 and resumed:
                if _complete(partial, sha256):  # nothing more to send: every byte is there
                    return None
                continue
            return getattr(e, "reason", None) or e
        except (OSError, http.client.HTTPException, ValueError) as e:  # the .part is kept
            # a Content-Length past the file's length: the body ends short of it, whole
            return None if _complete(partial, sha256) else getattr(e, "reason", None) or e
        if found == sha256:
            return None
        size = partial.stat().st_size
        partial.unlink()
        if not resumed:  # what came back, for a page (a /blob/ or login URL) sent in its place
            sent = (f"the server sent {size} bytes (Content-Type: "
                    f"{headers.get('Content-Type', 'none')}, Content-Encoding: "
                    f"{headers.get('Content-Encoding', 'none')})")
            page = "check that the URL serves the file itself (a /raw/ link, not a page)"
            if headers.get("Content-Length") is None and "chunked" not in \
                    headers.get("Transfer-Encoding", "").lower():
                # nothing said how long the body was: a connection closed early looks the same
                return (f"the file's SHA-256 is {found}, not {sha256}; {sent} and no "
                        "Content-Length, so the transfer may have been cut short (try again); "
                        f"else {page}")
            return f"the file's SHA-256 is {found}, not {sha256}; {sent}: {page}"


def _complete(partial, sha256):
    """Whether `partial` is there and is the file, by its SHA-256."""
    try:
        return sha256_of(partial) == sha256
    except OSError:
        return False


# What an HTTP request line cannot carry as it is: spaces, control characters, non-ASCII
_UNSENDABLE = re.compile(r"[^\x21-\x7e]")
# After the scheme and host: the path, query and fragment, where those are percent-encoded
_AFTER_HOST = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")
# Every printable ASCII character but the space, "%" too (a %XX already there stays as it is)
_SENDABLE = "".join(map(chr, range(0x21, 0x7f)))


def _sendable(url):
    """`url` with what follows its host percent-encoded where a request cannot carry it (a
    space, a control character, "è" as UTF-8: %C3%A8); a URL that can be sent is unchanged."""
    if not _UNSENDABLE.search(url):
        return url
    url = urllib.parse.unwrap(url)  # as urllib's Request does first: " <URL:...> " stripped
    host = _AFTER_HOST.match(url)
    start = host.end() if host else 0  # a host's non-ASCII is IDNA's, done by http.client
    return url[:start] + urllib.parse.quote(url[start:], safe=_SENDABLE)


def _download(url, partial, stream, timeout):
    """`url` into `partial`, resuming after the bytes already there; returns the response's
    headers."""
    have = partial.stat().st_size if partial.is_file() else 0
    request = urllib.request.Request(_sendable(url),
                                     headers={"Range": f"bytes={have}-"} if have else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        resumed = have and response.status == 206
        # the length http.client frames the body by, read before any byte: None where the body
        # is chunked (whose framing wins over a Content-Length, RFC 9112) or the header is no
        # length (-5), where it reads to the end; the header itself for a file:// URL
        total = getattr(response, "length", None)
        if not isinstance(response, http.client.HTTPResponse) and total is None:
            total = response.headers.get("Content-Length")
            total = int(total) if total and total.isdigit() else None
        total = None if total is None else total + (have if resumed else 0)
        done = have if resumed else 0
        with open(partial, "ab" if resumed else "wb") as f:
            for block in iter(lambda: response.read(CHUNK), b""):
                f.write(block)
                done += len(block)
                _show(stream, partial.name[:-5], done, total)
        if total is not None and done != total:
            raise OSError(f"the connection closed after {done} of {total} bytes")
    if stream is not None:
        stream.write("\n")
        stream.flush()
    return response.headers


def _show(stream, name, done, total):
    if stream is None:
        return
    if total:
        filled = 30 * done // total
        line = f"{name}: [{'#' * filled}{'.' * (30 - filled)}] {done / total:4.0%}"
    else:
        line = f"{name}: {done / 2 ** 20:.1f} MiB"
    stream.write("\r" + line)
    stream.flush()
