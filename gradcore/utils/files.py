"""get_file (DeZero's dezero.utils name): a file from a URL, downloaded once into gradcore's
cache folder through gradcore.utils.download.fetch."""
from .download import (_checked_sha256, cache_folder, fetch, sha256_folder, sha256_of,
                       url_file_name)


def files_folder():
    """The folder get_file keeps its files in (gradcore.utils.cache_dir): files/ in the cache
    folder ($GRADCORE_DATA, else ~/.gradcore), apart from the folders of the datasets (mnist/,
    cifar10/) and of Module.load (weights/), so that no URL's name can land on one of them."""
    return cache_folder() / "files"


def get_file(url, file_name=None, sha256=None, progress=None):
    """The path (a str) of the file at `url`, kept in gradcore.utils.cache_dir (files/ in
    $GRADCORE_DATA, else in ~/.gradcore). `file_name`: the name it is kept under, by default
    the last part of the URL's path.

    With `sha256` (64 hex digits) the file is cache_dir/<the first 16 hex digits>/file_name,
    downloaded there once if missing (resumable, written at once, checked), so that two URLs
    ending in one name keep a file each. `progress` as for fetch.

    DeZero's get_file(url, file_name) takes no checksum, and gradcore downloads nothing it
    cannot check. A file put at cache_dir/file_name by hand comes first: with `sha256`, it is
    used if its SHA-256 is that one; without, it is used as it is. Else, without `sha256`, the
    result is the one file of that name an earlier call with a sha256 downloaded, from whichever
    URL it came. No such file, or several (from different URLs): ValueError."""
    if file_name is None:
        file_name = url_file_name(url)
    if file_name in ("", ".", "..") or "/" in file_name or "\\" in file_name:
        raise ValueError(f"get_file({url!r}): the file name {file_name!r} is not a name for a "
                         "file in the cache folder; pass file_name='...' (no folders)")
    if "\0" in file_name:  # %00 in the URL: os calls would say only "embedded null byte"
        raise ValueError(f"get_file({url!r}): the file name {file_name!r} holds a null "
                         "character, which no file name can; pass file_name='...'")
    folder = files_folder()
    by_hand = folder / file_name
    if sha256 is not None:
        sha256 = _checked_sha256(sha256, "get_file")
        if by_hand.is_file() and sha256_of(by_hand) == sha256:
            return str(by_hand)
        return str(fetch(file_name, [url], sha256, folder=sha256_folder(folder, sha256),
                         progress=progress))
    if by_hand.is_file():
        return str(by_hand)
    kept = []
    if folder.is_dir():  # the downloads, a folder per SHA-256
        kept = [sub / file_name for sub in sorted(folder.iterdir()) if sub.is_dir()]
    kept = [path for path in kept if path.is_file()]
    if len(kept) == 1:
        return str(kept[0])
    if kept:
        listed = "".join(f"\n  {path}" for path in kept)
        raise ValueError(
            f"get_file({url!r}): {len(kept)} files named {file_name!r} are kept:{listed}\n"
            "Pass sha256='...' to say which (its first 16 hex digits name the folder), or keep "
            "each URL's file under a name of its own with file_name='...'")
    raise ValueError(
        f"get_file({url!r}): gradcore checks each download by its SHA-256, so pass "
        "sha256='...' (64 hex digits, from whoever publishes the file, or `sha256sum file` "
        f"of a copy you trust), or put the file at {folder / file_name} yourself")
