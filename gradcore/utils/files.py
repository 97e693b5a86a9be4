"""get_file (DeZero's dezero.utils name): a file from a URL, downloaded once into gradcore's
cache folder through gradcore.utils.download.fetch."""
import posixpath
import urllib.parse

from .download import cache_folder, fetch


def get_file(url, file_name=None, sha256=None, progress=None):
    """The path (a str) of the file at `url` in the cache folder ($GRADCORE_DATA, else
    ~/.gradcore; gradcore.utils.cache_dir), downloaded there once if missing: resumable,
    written at once, checked by `sha256` (64 hex digits). `file_name`: the name it is kept
    under, by default the last part of the URL's path. `progress` as for fetch.

    DeZero's get_file(url, file_name) takes no checksum. Without `sha256`, a file already in
    the cache folder is used as it is, and a missing one raises ValueError: gradcore downloads
    nothing it cannot check."""
    if file_name is None:
        file_name = posixpath.basename(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    if file_name in ("", ".", "..") or "/" in file_name or "\\" in file_name:
        raise ValueError(f"get_file({url!r}): the file name {file_name!r} is not a name for a "
                         "file in the cache folder; pass file_name='...' (no folders)")
    path = cache_folder() / file_name
    if sha256 is None:
        if path.is_file():
            return str(path)
        raise ValueError(
            f"get_file({url!r}): gradcore checks each download by its SHA-256, so pass "
            "sha256='...' (64 hex digits, from whoever publishes the file, or `sha256sum file` "
            f"of a copy you trust), or put the file at {path} yourself")
    return str(fetch(file_name, [url], sha256, progress=progress))
