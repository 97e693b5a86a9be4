"""Checkpoint files: the atomic .npz save, and reading and checking archives (never unpickling)."""
import collections
import contextlib
import errno
import io
import math
import os
import secrets
import stat
import struct
import zipfile
import zlib

import numpy

FORMAT_KEY = "__gradcore__"  # the entry that marks an .npz file as a gradcore checkpoint
FORMAT_VERSION = 1
# what reading a damaged or foreign archive raises from zipfile, zlib, struct and NumPy's .npy
# reader (OSError: a seek to an offset a damaged directory made up); all become CheckpointError
_DAMAGED = (zipfile.BadZipFile, zlib.error, struct.error, EOFError, OSError, ValueError, KeyError,
            IndexError, OverflowError, NotImplementedError, RuntimeError)
_DEFLATE_MAX_RATIO = 1032  # deflate codes a 258-byte match in 2 bits at best
_ZIP_NAME_MAX = 65535  # bytes: a zip entry's name length is a 16-bit field
_NPY_HEADER_READERS = {(1, 0): numpy.lib.format.read_array_header_1_0,
                       (2, 0): numpy.lib.format.read_array_header_2_0}


# os.access checks the real user unless told to check the effective one, as open() does
_EFFECTIVE_IDS = os.access in os.supports_effective_ids


class CheckpointError(ValueError):
    """A file that is not a readable gradcore checkpoint, or one that does not match the model."""


def _write_atomically(path, arrays):
    """Write `arrays` (name -> NumPy array) as an .npz archive to `path`: into a new file of
    its own beside the final one, flushed to disk, then renamed over it. A reader or another
    save therefore sees the old file or a whole new one; the rename replaces a symlink's
    target, not the link. A file this user may not write (chmod a-w) is refused, as open()
    would refuse it, although the rename needs only the folder to be writable."""
    final = os.path.realpath(path)
    try:
        st_mode = os.stat(final).st_mode
        mode = stat.S_IMODE(st_mode)  # kept: the new file is another inode
    except FileNotFoundError:
        mode = None  # a new file: the mode _new_file gave it, as for any created file
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:
            raise
        mode = None  # _new_file says the name is too long
    if mode is not None and stat.S_ISDIR(st_mode):  # the rename would fail once all is written
        raise IsADirectoryError(errno.EISDIR, f"save: cannot write {path}: it is a folder; save "
                                "under another name, or to a file inside that folder")
    if mode is not None and not os.access(final, os.W_OK, effective_ids=_EFFECTIVE_IDS):
        raise PermissionError(errno.EACCES, f"save: {path} is write-protected (mode "
                              f"{mode:#o}); it was left as it was. Make it writable (chmod u+w) "
                              "to replace it, or save under another name")
    fd, temporary = _new_file(final, path)
    try:
        with os.fdopen(fd, "wb") as f:
            _write_archive(f, arrays)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the checkpoint
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, final)
    except BaseException:  # Ctrl-C too: never leave the temporary file behind
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def _write_archive(f, arrays):
    """Write `arrays` (name -> NumPy array) into the binary file object `f` as an .npz archive
    (as numpy.savez_compressed writes one, never pickling); `f` stays open."""
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, a in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as entry:
                numpy.lib.format.write_array(entry, a, allow_pickle=False)


def _is_file_object(path):
    """True if `path` is a file object (io.BytesIO, open(p, "rb")) in place of a path."""
    return hasattr(path, "read") or hasattr(path, "write")


def _check_binary(f, name, mode):
    """TypeError, before anything is read or written, if the file object `f` (named `name` in
    messages) is a text one (open(p), io.StringIO): a checkpoint is bytes, so it needs a file
    opened in the binary `mode` ("rb" or "wb")."""
    if isinstance(f, io.TextIOBase):
        verb = "read a checkpoint from" if "r" in mode else "write a checkpoint into"
        raise TypeError(f"cannot {verb} {name}: it is open in text mode, and a checkpoint is "
                        f"binary; open it in binary mode, open(path, {mode!r}), or pass the path")


def _check_entry_names(names):
    """ValueError, before anything is written, naming the first of `names` (state_dict names)
    that an .npz archive cannot hold as the entry name + ".npy": one holding NUL (zipfile cuts
    the name there, so the file would not load back), one UTF-8 cannot encode (a lone
    surrogate), or one longer than the zip format's 65535 bytes; and the name the checkpoint
    marker keeps for itself (FORMAT_KEY)."""
    if FORMAT_KEY in names:
        raise ValueError(f"save: a parameter is named {FORMAT_KEY!r}, the name reserved for "
                         "the checkpoint marker; rename it")
    for name in names:
        try:
            size = len((name + ".npy").encode("utf-8"))
        except UnicodeEncodeError as e:
            reason = (f"holds {e.object[e.start]!r}, a lone surrogate that UTF-8 cannot encode "
                      "(a name decoded from bytes with errors='surrogateescape'?)")
        else:
            if "\x00" in name:
                reason = "holds a NUL character ('\\x00'), where zipfile would cut it"
            elif size > _ZIP_NAME_MAX:
                reason = (f"is {size - 4} bytes long in UTF-8, more than the "
                          f"{_ZIP_NAME_MAX - 4} a zip entry's name can hold beside '.npy'")
            else:
                continue
        shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters)"
        raise ValueError(f"save: the parameter or buffer {shown} cannot be saved: its name "
                         f"{reason}; nothing was written. Rename the attribute that holds it")


def _new_file(final, path):
    """(fd, name) of a new empty file beside `final`, named after it, that no other save uses
    (O_EXCL); created with mode 0o666, which the umask reduces as for any new file. An error
    names the folder, or the name when it is too long (`path`: the name the caller gave)."""
    folder, base = os.path.split(final)
    stem = _temporary_stem(base)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        name = os.path.join(folder, f".{stem}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(name, flags, 0o666), name
        except FileExistsError:
            continue  # 64 random bits taken: draw again
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                reason = f"the folder {folder} does not exist; create it first (os.makedirs)"
            elif e.errno == errno.ENAMETOOLONG:
                reason = (f"its name is {len(os.fsencode(base))} bytes long, more than the file "
                          "system allows (255 bytes on most); choose a shorter name")
            else:
                reason = f"cannot create a file in the folder {folder} ({e.strerror})"
            raise type(e)(e.errno, f"save: cannot write {path}: {reason}") from None


def _temporary_stem(base):
    """The part of the file name `base` that names its temporary file: cut (at a whole UTF-8
    character) so that the temporary name, 22 bytes longer, is no longer than `base` or 100
    bytes, whichever is longer: a name the file system takes gives a temporary name it takes."""
    encoded = os.fsencode(base)
    keep = max(len(encoded), 100) - len(".." + 16 * "0" + ".tmp")
    if len(encoded) <= keep:
        return base
    return encoded[:keep].decode("utf-8", "ignore")


def _checkpoint_source(path):
    """(what to open, its name in messages) for the checkpoint `path`: a file object as it is,
    named by its `name` (open()'s path) or else its type; a path as _checkpoint_path gives it."""
    if _is_file_object(path):
        name = getattr(path, "name", None)
        return path, name if isinstance(name, str) else f"the {type(path).__name__} given"
    path = _checkpoint_path(path)
    return path, path


def _checkpoint_path(path):
    """The checkpoint file that `path` names, as a string: the file `save(path)` writes.
    Without ".npz" at its end, that is path + ".npz" when such a file exists, else `path`;
    CheckpointError when both are files (which one is meant cannot be told)."""
    path = os.fsdecode(path)
    if path.endswith(".npz") or not os.path.isfile(path + ".npz"):
        return path
    if os.path.isfile(path):
        raise CheckpointError(
            f"the checkpoint name {path!r} is ambiguous: both {path} and {path}.npz are files "
            f"(save({path!r}) writes the second); load the one meant by its full name, or "
            "rename or remove the other")
    return path + ".npz"  # also when `path` is a folder: save(path) wrote this one


_Header = collections.namedtuple("_Header", ["info", "shape", "dtype"])


@contextlib.contextmanager
def _open_checkpoint(source, path):
    """(zipfile.ZipFile, file size) of the checkpoint `source` (a path, or a binary file object
    read from where it is, and left open: at the end of the archive once it was read, where it
    was after an error, whether raised here or in the caller's with block: a caller checks all
    it reads inside it), named `path` in messages: its zip directory read, nothing
    decompressed. FileNotFoundError if it is missing; CheckpointError if it is no zip archive,
    or one that does not begin where the file is (another archive follows it, or other bytes
    come before it)."""
    with contextlib.ExitStack() as stack:
        if not _is_file_object(source):
            f = stack.enter_context(open(source, "rb"))
        else:
            _check_binary(source, path, "rb")
            f = source
        if not f.seekable():
            raise TypeError(f"cannot read a checkpoint from {path}: it cannot seek, which "
                            "reading a zip archive needs; read it into an io.BytesIO first, or "
                            "pass a path")
        start = f.tell()
        if f.read(6) == b"\x93NUMPY":
            raise CheckpointError(
                f"{path} is not a gradcore checkpoint: it holds a single array (.npy), not an "
                ".npz archive; write checkpoints with Module.save")
        try:
            size = f.seek(0, os.SEEK_END)
            f.seek(start)
            archive = stack.enter_context(zipfile.ZipFile(f))
            end = _archive_end(f, archive)
        except _DAMAGED as e:
            f.seek(start)
            raise CheckpointError(
                f"{path} is not a gradcore checkpoint: it is not a readable .npz (zip) archive, "
                f"or it is truncated or damaged ({_described(e)}); write checkpoints with "
                "Module.save") from e
        # zipfile reads the directory at the end of the file: with two archives in one stream
        # that is the last one's, whatever the position
        found = min((info.header_offset for info in archive.infolist()),
                    default=archive.start_dir)
        if found != start:
            f.seek(start)
            raise CheckpointError(
                f"{path} is not one whole checkpoint from byte {start}, where reading began: "
                f"the zip archive found begins at byte {found} (another archive follows the "
                "one there, as when two checkpoints are saved into one stream, or other bytes "
                "come before it). Save each checkpoint into a file or io.BytesIO of its own")
        try:
            yield archive, size
        except BaseException:
            f.seek(start)
            raise
        f.seek(end)


def _archive_end(f, archive):
    """The offset just past `archive` in `f`: its central directory (at archive.start_dir)
    walked entry by entry, then the zip64 end records if there are any, then the end record
    and its comment."""
    f.seek(archive.start_dir)
    for _ in archive.infolist():
        # a 46-byte directory entry, then its name, extra field and comment
        name_size, extra_size, comment_size = struct.unpack("<28xHHH12x", f.read(46))
        f.seek(name_size + extra_size + comment_size, os.SEEK_CUR)
    if f.read(4) == b"PK\x06\x06":  # a zip64 end record: its size after the first 12 bytes
        size, = struct.unpack("<Q", f.read(8))
        f.seek(size + 20, os.SEEK_CUR)  # and its 20-byte locator
    else:
        f.seek(-4, os.SEEK_CUR)
    comment_size, = struct.unpack("<20xH", f.read(22))
    return f.tell() + comment_size


def _described(error):
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _has_dezero_names(infos):
    """True if the archive's entries are .npy arrays named as DeZero's save_weights names
    parameters: attribute names joined by '/' ("l0/W"), where gradcore joins them by '.'."""
    names = [info.filename.removesuffix(".npy") for info in infos]
    return bool(names) and all(
        info.filename.endswith(".npy") and all(part.isidentifier() for part in name.split("/"))
        for info, name in zip(infos, names))


def _read_headers(path, archive, file_size):
    """name -> _Header of every array in the checkpoint, from the zip directory and each entry's
    .npy header (a few bytes decompressed per entry); the format marker is checked first (its
    value read) and left out. A file with no marker whose names are DeZero's ("l0/W", written
    by dezero's save_weights) is read with gradcore's names ("l0.W"), checked the same way.
    CheckpointError for anything a checkpoint cannot hold."""
    infos = archive.infolist()
    marker = FORMAT_KEY + ".npy"
    dezero = False
    if marker not in [info.filename for info in infos]:
        dezero = _has_dezero_names(infos)
        if not dezero:
            names = [info.filename.removesuffix(".npy") for info in infos]
            raise CheckpointError(
                f"{path} is not a gradcore checkpoint: it has no {FORMAT_KEY!r} entry (its "
                f"entries: {', '.join(names) or 'none'}), and those are not the names DeZero's "
                "save_weights writes (attribute names joined by '/', as in l0/W) either. Write "
                "checkpoints with Module.save; to load arrays saved some other way, read them "
                "with numpy.load(path) and pass load_state_dict a dict of them under the "
                "model's state_dict() names (as in l0.W)")
    headers = {}
    for info in sorted(infos, key=lambda info: info.filename != marker):  # the marker first
        if not info.filename.endswith(".npy"):
            raise CheckpointError(f"{path}: entry {info.filename!r} is not an .npy array; a "
                                  "gradcore checkpoint holds .npy arrays only")
        name = info.filename.removesuffix(".npy")
        if dezero:
            name = name.replace("/", ".")  # no name holds '.': two entries never become one
        if name in headers:
            raise CheckpointError(f"{path}: entry {name!r} appears twice; the file is damaged or "
                                  "was not written by Module.save")
        headers[name] = _read_header(path, archive, info, file_size)
        if name == FORMAT_KEY:
            _check_marker(path, archive, headers[name])
    headers.pop(FORMAT_KEY, None)  # absent from a DeZero file
    return headers


def _read_header(path, archive, info, file_size):
    """The _Header of one entry, its sizes checked before it is opened (so that a small file
    cannot declare gigabytes) and after its .npy header is read (so that they agree)."""
    where = f"{path}: entry {info.filename.removesuffix('.npy')!r}"
    if info.flag_bits & 0x1:
        raise CheckpointError(f"{where} is encrypted; gradcore checkpoints never are")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise CheckpointError(
            f"{where} uses zip compression method {info.compress_type}; checkpoints are stored "
            "or deflated (as Module.save and numpy.savez write them)")
    if info.header_offset + info.compress_size > file_size:
        raise CheckpointError(f"{where} declares {info.compress_size} compressed bytes, past the "
                              "end of the file: the file is truncated or damaged")
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else _DEFLATE_MAX_RATIO
    if info.file_size > info.compress_size * ratio:
        raise CheckpointError(
            f"{where} declares {info.file_size} bytes, more than its {info.compress_size} "
            "compressed bytes can hold: the file is damaged or forged")
    try:
        with archive.open(info) as f:
            version = numpy.lib.format.read_magic(f)
            if version not in _NPY_HEADER_READERS:
                raise ValueError(f".npy format version {version} (gradcore writes 1.0)")
            shape, _, dtype = _NPY_HEADER_READERS[version](f)
            header_size = f.tell()
    except _DAMAGED as e:
        raise CheckpointError(f"{where}: its .npy header cannot be read ({_described(e)}); the "
                              "file is damaged or is not a gradcore checkpoint") from e
    if dtype.hasobject:
        raise CheckpointError(
            f"{where} holds {dtype} values, which cannot be read without pickle; gradcore never "
            "unpickles (loading a file must not run code), so this file is refused")
    if dtype.kind not in "biuf":
        raise CheckpointError(f"{where} holds {dtype} values, not real numbers (bool, integer "
                              "or floating point)")
    if any(n < 0 for n in shape):
        raise CheckpointError(f"{where}: its .npy header declares the shape {shape}; the file "
                              "is damaged")
    size = header_size + math.prod(shape) * dtype.itemsize
    if info.file_size != size:
        raise CheckpointError(
            f"{where}: its .npy header describes {shape} {dtype} values ({size} bytes with the "
            f"header) but the zip directory declares {info.file_size} bytes; the file is "
            "damaged or forged")
    return _Header(info, shape, dtype)


def _check_marker(path, archive, header):
    """Read the format version (a checked, tiny entry); CheckpointError unless this gradcore
    reads it."""
    version = None
    if header.shape == () and header.dtype.kind in "iu":
        try:
            with archive.open(header.info) as f:
                version = int(numpy.lib.format.read_array(f, allow_pickle=False))
        except _DAMAGED as e:
            raise CheckpointError(f"{path}: the {FORMAT_KEY!r} entry is damaged "
                                  f"({_described(e)})") from e
    if version is None or version < 1:
        raise CheckpointError(f"{path}: the {FORMAT_KEY!r} entry is not a format version number; "
                              "the file is damaged or was not written by Module.save")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path} is a version {version} gradcore checkpoint; this gradcore "
                              f"reads up to version {FORMAT_VERSION}: upgrade gradcore")


def _read_arrays(path, archive, headers):
    """name -> NumPy array of every entry in `headers` (checked by _read_headers); every one is
    read, its CRC checked, before any is returned."""
    arrays = {}
    for name, header in headers.items():
        try:
            with archive.open(header.info) as f:
                arrays[name] = numpy.lib.format.read_array(f, allow_pickle=False)
        except _DAMAGED as e:
            raise CheckpointError(f"{path}: entry {name!r}: its data is damaged "
                                  f"({_described(e)}); nothing was loaded") from e
    return arrays


def read_checkpoint(path):
    """The arrays of a checkpoint written by Module.save (`path` names the file as for save:
    path + ".npz" when that file exists; or is a binary file object), or by DeZero's
    save_weights (its "l0/W" read as "l0.W"), as a dict name -> NumPy array. Raises
    CheckpointError (a ValueError) for a file that is not a readable gradcore checkpoint, with
    every header checked before any array is decompressed; nothing is ever unpickled. A missing
    file raises FileNotFoundError."""
    source, path = _checkpoint_source(path)
    with _open_checkpoint(source, path) as (archive, size):
        return _read_arrays(path, archive, _read_headers(path, archive, size))
