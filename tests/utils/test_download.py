"""fetch against a real HTTP server on the loopback address: download, cache, checksums,
mirrors, resuming."""
import hashlib
import http.server
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from gradcore.utils.download import DownloadError, cache_folder, fetch

BODY = bytes(range(256)) * 400  # 100 KiB
DIGEST = hashlib.sha256(BODY).hexdigest()
PAGE = b"<!DOCTYPE html><html><body>Sign in to download</body></html>\n" * 20  # 1220 bytes


class Server:
    """A thread serving BODY at /file (and at the decoded paths in `served`), honouring Range
    (416 for a range from the end on, as S3 answers), and an HTML page at /page (what a /blob/ or
    login URL answers); `cut` bytes: the next reply stops there (a broken connection);
    `length=False`: replies say no Content-Length (the body ends when the connection closes), a
    string: that Content-Length, whatever the body; `chunked`: the body in chunks (HTTP/1.1);
    `delay` seconds between 4 KiB blocks (a slow download). `requests` lists each request's
    Range header, `targets` each request's path as sent."""

    def __init__(self, delay=0.0):
        self.requests, self.targets, self.cut, self.length = [], [], None, True
        self.chunked = False
        self.served = {"/file"}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                owner.requests.append(self.headers.get("Range"))
                owner.targets.append(self.path)
                if self.path == "/page":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(PAGE)))
                    self.end_headers()
                    self.wfile.write(PAGE)
                    return
                if urllib.parse.unquote(self.path) not in owner.served:
                    self.send_error(404)
                    return
                start = 0
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].split("=")[1].split("-")[0])
                    if start >= len(BODY):  # as S3 answers a range from the end or past it
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(BODY)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
                else:
                    self.send_response(200)
                if owner.length:  # else HTTP/1.0's end of the body: the connection closes
                    self.send_header("Content-Length", owner.length if isinstance(
                        owner.length, str) else str(len(BODY) - start))
                body = BODY[start:]
                if owner.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(body), 4096):
                        block = body[i:i + 4096]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.end_headers()
                if owner.cut is not None:
                    body, owner.cut = body[:owner.cut], None
                for i in range(0, len(body), 4096):
                    self.wfile.write(body[i:i + 4096])
                    if delay:
                        self.wfile.flush()
                        time.sleep(delay)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_download_then_the_cache(server, tmp_path):
    path = fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    assert path == tmp_path / "data.bin" and path.read_bytes() == BODY
    assert fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path,
                 progress=False) == path
    assert server.requests == [None]  # the second call did not download
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]


def test_a_wrong_checksum_leaves_no_file(server, tmp_path):
    with pytest.raises(DownloadError, match="SHA-256 is .*, not 0000"):
        fetch("data.bin", [server.url + "/file"], "0" * 64, folder=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_mirror_that_is_down_and_one_that_has_no_file(server, tmp_path):
    urls = [f"http://127.0.0.1:{closed_port()}/file", server.url + "/missing", server.url + "/file"]
    path = fetch("data.bin", urls, DIGEST, folder=tmp_path, progress=False)
    assert path.read_bytes() == BODY


@pytest.mark.parametrize("length, chunked", [("-5", False), ("12345", True), ("lots", False)],
                         ids=["negative", "chunked beside a length", "not a number"])
def test_a_content_length_the_body_is_not_framed_by(server, tmp_path, length, chunked):
    """The body is read as http.client frames it (a chunked body to its last chunk, whatever a
    Content-Length says, as RFC 9112 has it; a length that is no length ignored, the body read to
    the end): the whole file arrived, and fetch said "closed after 102400 of -5 bytes"."""
    server.length, server.chunked = length, chunked
    path = fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    assert path.read_bytes() == BODY


def test_a_content_length_past_the_end_of_the_whole_file_takes_the_file(server, tmp_path):
    """The server sends every byte but says 10 more: the .part was the file, yet fetch said
    "closed after 102400 of 102410 bytes" at this and every later try."""
    server.length = str(len(BODY) + 10)
    path = fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    assert path.read_bytes() == BODY and [p.name for p in tmp_path.iterdir()] == ["data.bin"]


def test_a_broken_download_resumes_where_it_stopped(server, tmp_path):
    server.cut = 30_000
    with pytest.raises(DownloadError, match="closed after|IncompleteRead|Incomplete"):
        fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    assert (tmp_path / "data.bin.part").stat().st_size == 30_000
    path = fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    assert path.read_bytes() == BODY and server.requests[-1] == "bytes=30000-"


def test_an_upper_case_sha256_is_the_same_digest(server, tmp_path):
    path = fetch("data.bin", [server.url + "/file"], f" {DIGEST.upper()}\n", folder=tmp_path,
                 progress=False)
    assert path.read_bytes() == BODY
    assert fetch("data.bin", [server.url + "/file"], DIGEST.upper(), folder=tmp_path,
                 progress=False) == path  # the cached file is accepted too
    assert server.requests == [None]


@pytest.mark.parametrize("digest", ["abc", "g" * 64, None, 123])
def test_a_sha256_that_is_not_64_hex_digits_is_refused_first(digest, server, tmp_path):
    with pytest.raises(ValueError, match="fetch: sha256 must be .*64 hex digits"):
        fetch("data.bin", [server.url + "/file"], digest, folder=tmp_path, progress=False)
    assert server.requests == [] and list(tmp_path.iterdir()) == []


FETCH_WHEN_TOLD = """
import hashlib, sys
from gradcore.utils.download import fetch
print("ready", flush=True)
sys.stdin.readline()  # the test says go once every process is ready: the fetches overlap
path = fetch("data.bin", [sys.argv[1]], sys.argv[2], folder=sys.argv[3], progress=False)
print(hashlib.sha256(path.read_bytes()).hexdigest())
"""


def test_processes_fetching_one_file_at_once_take_turns(tmp_path):
    # MPI ranks loading the same weights: one downloads while the others wait for its lock
    # (all appending to one .part corrupted it, or one renamed it under another)
    server = Server(delay=0.01)  # 25 blocks of 4 KiB: a download of some 0.25 s
    try:
        processes = [subprocess.Popen(
            [sys.executable, "-c", FETCH_WHEN_TOLD, server.url + "/file", DIGEST, str(tmp_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(3)]
        for p in processes:
            assert p.stdout.readline() == "ready\n", p.communicate()[1]
        for p in processes:
            p.stdin.write("go\n")
            p.stdin.flush()
        outcomes = [p.communicate(timeout=60) for p in processes]
    finally:
        server.close()
    assert [(p.returncode, out.strip()) for p, (out, _) in zip(processes, outcomes)] == \
        [(0, DIGEST)] * 3, [err for _, err in outcomes]
    assert hashlib.sha256((tmp_path / "data.bin").read_bytes()).hexdigest() == DIGEST
    assert server.requests == [None]  # one download; the others found the file after it
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]  # no .part or .lock left


WAITING = "data.bin: another process is downloading it; waiting\n"


def within(seconds, condition):
    """True once `condition()` is, asked every 10 ms; False if it is not within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def first_line(pipe, seconds=30):
    """The first line read from `pipe` ("" if it closes first); fails if none comes within
    `seconds` (a read with a deadline: a pipe's readline has none)."""
    lines = []
    threading.Thread(target=lambda: lines.append(pipe.readline()), daemon=True).start()
    assert within(seconds, lambda: lines), f"no line within {seconds} s"
    return lines[0]


def put_in_place(folder):
    """BODY as folder / data.bin, renamed into place as the download holding the lock does, so
    that a fetch never sees half of it."""
    written = folder / "data.bin.theirs"
    written.write_bytes(BODY)
    os.replace(written, folder / "data.bin")


def test_a_fetch_waits_for_the_lock_and_then_finds_the_file(server, tmp_path):
    fcntl = pytest.importorskip("fcntl")  # Linux and macOS; Windows locks with msvcrt
    stream, found = io.StringIO(), []
    with open(tmp_path / "data.bin.lock", "w") as held:  # as another process's download holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        waiting = threading.Thread(target=lambda: found.append(
            fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=stream)))
        waiting.start()
        # the file only once it waits: it looks for one before the lock, and would take it there
        assert within(30, lambda: WAITING in stream.getvalue()), stream.getvalue()
        assert waiting.is_alive() and server.requests == []  # it waits, downloading nothing
        put_in_place(tmp_path)
        fcntl.flock(held, fcntl.LOCK_UN)
        waiting.join(timeout=30)
    assert found == [tmp_path / "data.bin"] and server.requests == []  # no download of its own
    assert stream.getvalue() == WAITING
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]


def test_a_lock_file_that_cannot_be_made_is_an_error_that_says_so(tmp_path):
    (tmp_path / "data.bin.lock").mkdir()  # as a folder it cannot write would refuse it
    with pytest.raises(DownloadError, match=r"cannot download data.bin: cannot create "
                                            r".*data.bin.lock \(Is a directory\).*GRADCORE_DATA"):
        fetch("data.bin", ["http://127.0.0.1:1/file"], DIGEST, folder=tmp_path, progress=False)


FETCH_AS_A_USER = """
import sys
from gradcore.utils.download import DownloadError, cache_folder, fetch
progress = sys.stdout if sys.argv[4] == "progress" else False
try:
    path = fetch("data.bin", [sys.argv[1]], sys.argv[2], folder=sys.argv[3], progress=progress)
except DownloadError as e:
    print(e)
else:
    print("fetched", path.name)
"""


def fetch_as_a_user(url, folder, progress=False):
    """Start fetch(data.bin) in a process that file permissions stop: as root, one without the
    capabilities that pass them by (skips where setpriv cannot drop them). `progress`: its
    progress lines go to its stdout, before what it prints at the end."""
    if not hasattr(os, "geteuid"):
        pytest.skip("needs POSIX file permissions")
    command = [sys.executable, "-c", FETCH_AS_A_USER, url, DIGEST, str(folder),
               "progress" if progress else "quiet"]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root, needs setpriv to drop CAP_DAC_OVERRIDE")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *command]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(process):
    out, err = process.communicate(timeout=60)
    if process.returncode and err.startswith("setpriv"):
        pytest.skip(f"setpriv cannot drop the capabilities here: {err.strip()}")
    assert process.returncode == 0, err
    return out.strip()


def test_a_lock_file_of_another_user_is_taken_read_only(server, tmp_path):
    # another user's download made it (umask 022: not writable here) and ended without removing it
    (tmp_path / "data.bin.lock").touch(0o444)
    assert outcome(fetch_as_a_user(server.url + "/file", tmp_path)) == "fetched data.bin"
    assert (tmp_path / "data.bin").read_bytes() == BODY
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]


def test_a_fetch_waits_on_a_lock_file_it_cannot_write(server, tmp_path):
    fcntl = pytest.importorskip("fcntl")
    (tmp_path / "data.bin.lock").touch(0o444)
    with open(tmp_path / "data.bin.lock") as held:  # another user's download, still running
        fcntl.flock(held, fcntl.LOCK_EX)
        waiting = fetch_as_a_user(server.url + "/file", tmp_path, progress=True)
        said = first_line(waiting.stdout)  # the file only once it waits, as in the test above
        if not said:  # it ended saying nothing: setpriv refused (a skip), or why it failed
            outcome(waiting)
        assert said == WAITING
        assert waiting.poll() is None and server.requests == []  # it waits, downloading nothing
        put_in_place(tmp_path)
        fcntl.flock(held, fcntl.LOCK_UN)
        assert outcome(waiting) == "fetched data.bin"
    assert server.requests == []


def test_a_lock_file_that_cannot_be_opened_is_named_with_what_to_do(server, tmp_path):
    (tmp_path / "data.bin.lock").touch(0o000)
    message = outcome(fetch_as_a_user(server.url + "/file", tmp_path))
    assert re.fullmatch(r"\[Errno 13\] cannot download data.bin: the lock file .*data.bin.lock is "
                        r"there but this user can neither write nor read it \(Permission "
                        r"denied\); another user's download made it\? Remove it once no "
                        r"download of the file is running, or set GRADCORE_DATA to a folder of "
                        r"your own", message), message
    assert server.requests == []


def test_a_folder_where_the_file_goes_is_refused_before_downloading(server, tmp_path):
    (tmp_path / "mnist").mkdir()  # as a dataset's folder of the same name
    with pytest.raises(DownloadError, match=r"cannot download mnist to .*mnist: a folder \(or "
                                            r"something else that is not a file\) is there; "
                                            r"move it away"):
        fetch("mnist", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    assert server.requests == [] and [p.name for p in tmp_path.iterdir()] == ["mnist"]


@pytest.mark.parametrize("under", ["a file", "a file's folder"])
def test_a_cache_folder_that_cannot_be_made_is_an_error_that_says_what_to_do(under, tmp_path):
    (tmp_path / "taken").write_bytes(b"a file of the user's")
    folder = tmp_path / "taken" if under == "a file" else tmp_path / "taken" / "cache"
    taken = str(tmp_path / "taken")
    with pytest.raises(DownloadError, match=r"cannot download data.bin: cannot create the folder "
                                            rf".*taken.*; move away the file {re.escape(taken)}, "
                                            r"which is where a folder must be, or set "
                                            r"GRADCORE_DATA"):
        fetch("data.bin", ["http://127.0.0.1:1/file"], DIGEST, folder=folder, progress=False)
    assert (tmp_path / "taken").read_bytes() == b"a file of the user's"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no "
                    "folder can be made (even by root, whom permissions do not stop)")
def test_a_folder_that_cannot_be_written_is_named_with_the_one_that_failed():
    with pytest.raises(DownloadError, match=r"cannot create the folder /proc/gradcore-test/files "
                                            r"\(.*: /proc/gradcore-test\); make /proc writable, "
                                            r"or set GRADCORE_DATA"):
        fetch("data.bin", ["http://127.0.0.1:1/file"], DIGEST, folder="/proc/gradcore-test/files",
              progress=False)


def test_a_page_served_in_place_of_the_file_is_described(server, tmp_path):
    with pytest.raises(DownloadError) as info:
        fetch("model.npz", [server.url + "/page"], DIGEST, folder=tmp_path, progress=False)
    assert (f"/page: the file's SHA-256 is {hashlib.sha256(PAGE).hexdigest()}, not {DIGEST}; the "
            "server sent 1220 bytes (Content-Type: text/html; charset=utf-8, Content-Encoding: "
            "none): check that the URL serves the file itself (a /raw/ link, not a page)"
            ) in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_body_cut_short_without_a_content_length_says_it_may_be_cut(server, tmp_path):
    server.length, server.cut = False, 30_000  # nothing tells the client that bytes are missing
    with pytest.raises(DownloadError) as info:
        fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    cut = hashlib.sha256(BODY[:30_000]).hexdigest()
    assert (f"/file: the file's SHA-256 is {cut}, not {DIGEST}; the server sent 30000 bytes "
            "(Content-Type: none, Content-Encoding: none) and no Content-Length, so the transfer "
            "may have been cut short (try again); else check that the URL serves the file itself "
            "(a /raw/ link, not a page)\n") in str(info.value)
    assert list(tmp_path.iterdir()) == []
    path = fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    assert path.read_bytes() == BODY  # tried again, whole


@pytest.mark.parametrize("path", ["/modèle 2.npz", "/mod%C3%A8le%202.npz", "/mod%C3%A8le 2.npz",
                                  "/modèle%202.npz"])
def test_a_url_with_spaces_or_other_than_ascii_is_percent_encoded(path, server, tmp_path):
    # http.client refuses them ("ordinal not in range(128)", "can't contain control
    # characters"); a %XX already there is kept as it is, not encoded again as %25XX
    server.served = {"/modèle 2.npz", "/a?b=é"}
    got = fetch("model.npz", [server.url + path], DIGEST, folder=tmp_path, progress=False)
    assert got.read_bytes() == BODY and server.targets == ["/mod%C3%A8le%202.npz"]
    server.targets.clear()
    got = fetch("q.npz", [" " + server.url + "/a?b=é\n"], DIGEST, folder=tmp_path, progress=False)
    assert got.read_bytes() == BODY and server.targets == ["/a?b=%C3%A9"]


def test_a_url_that_can_be_sent_is_sent_as_it_is():
    from gradcore.utils.download import _sendable
    for url in ("http://h:8/a%20b/c.npz?x=1&y=%C3%A9#f", "http://h/100%/[a]/~b;c=d,e@f!$'()*+",
                "https://h/x.npz"):
        assert _sendable(url) is url
    assert _sendable("http://bücher.de/ü x") == "http://bücher.de/%C3%BC%20x"  # host: IDNA's


def test_a_null_character_in_the_name_is_an_error_naming_fetch_and_the_name(server, tmp_path):
    with pytest.raises(ValueError, match=r"^fetch: cannot keep 'a\\x00b.npz' at '.*a\\x00b.npz': "
                                         r"a file name or folder cannot hold a null character "
                                         r"\(%00 in a URL\); pass another name$"):
        fetch("a\0b.npz", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    assert server.requests == [] and list(tmp_path.iterdir()) == []


def test_a_folder_under_the_home_folder_is_expanded(server, tmp_path, monkeypatch):
    # as GRADCORE_DATA="~/..." is: not a folder named "~" in the current one
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    path = fetch("data.bin", [server.url + "/file"], DIGEST, folder="~/data", progress=False)
    assert path == tmp_path / "home" / "data" / "data.bin" and path.read_bytes() == BODY
    assert list((tmp_path / "here").iterdir()) == []


def test_offline_says_which_file_to_put_where(tmp_path):
    with pytest.raises(DownloadError, match=rf"Offline, put the file at {tmp_path}.data.bin "
                                            rf"\(SHA-256 {DIGEST}\)"):
        fetch("data.bin", [f"http://127.0.0.1:{closed_port()}/file"], DIGEST, folder=tmp_path,
              progress=False)


def test_a_damaged_cached_file_is_refused(tmp_path):
    (tmp_path / "data.bin").write_bytes(b"not it")
    with pytest.raises(DownloadError, match="delete it"):
        fetch("data.bin", ["http://127.0.0.1:1/file"], DIGEST, folder=tmp_path, progress=False)


def test_the_cache_folder_follows_gradcore_data(monkeypatch, tmp_path, server):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "cache"))
    path = fetch("data.bin", [server.url + "/file"], DIGEST, progress=False)
    assert path == tmp_path / "cache" / "data.bin"


def test_a_relative_gradcore_data_stays_where_it_was_first_read(monkeypatch, tmp_path, server):
    monkeypatch.setattr("gradcore.utils.download._relative_folders", {})  # other tests' values
    monkeypatch.setenv("GRADCORE_DATA", "cache")
    monkeypatch.chdir(tmp_path)
    path = fetch("data.bin", [server.url + "/file"], DIGEST, progress=False)
    assert path == tmp_path / "cache" / "data.bin"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    offline = f"http://127.0.0.1:{closed_port()}/file"
    assert fetch("data.bin", [offline], DIGEST, progress=False) == path  # found, not fetched
    assert cache_folder() == tmp_path / "cache"
    monkeypatch.setenv("GRADCORE_DATA", "other")  # another value: read from the folder of now
    assert cache_folder() == tmp_path / "elsewhere" / "other"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # "~" and absolute paths are read anew
    monkeypatch.setenv("GRADCORE_DATA", "~/data")
    assert cache_folder() == tmp_path / "home" / "data"
    monkeypatch.setenv("HOME", str(tmp_path / "home2"))
    assert cache_folder() == tmp_path / "home2" / "data"
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "abs"))
    assert cache_folder() == tmp_path / "abs"


@pytest.mark.parametrize("left, case, whole", [
    (BODY, "the whole file was left, not yet renamed: the server answers 416; it is the file",
     False),
    (BODY * 2, "more bytes left than the file has (another file's): 416", True),
    (b"wrong start", "a resumed download comes out with another SHA-256", True),
])
def test_a_part_file_that_cannot_resume_is_downloaded_again_whole(left, case, whole, tmp_path,
                                                                  server):
    (tmp_path / "f.bin.part").write_bytes(left)
    path = fetch("f.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=False)
    assert path.read_bytes() == BODY, case
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]  # no .part left
    # tried to resume, then whole where what was there is not the file
    assert server.requests == [f"bytes={len(left)}-", *([None] if whole else [])]


def test_progress_true_shows_it_on_stderr(server, tmp_path, capsys):
    # PyTorch's spelling (torch.hub's progress=True); MNIST and CIFAR10 pass theirs on to fetch
    path = fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=True)
    assert path.read_bytes() == BODY and [p.name for p in tmp_path.iterdir()] == ["data.bin"]
    assert capsys.readouterr().err.endswith("data.bin: [" + "#" * 30 + "] 100%\n")


@pytest.mark.parametrize("progress", [1, "stderr"])
def test_a_progress_that_is_not_a_stream_is_refused_first(progress, server, tmp_path):
    with pytest.raises(TypeError, match=r"fetch: progress must be a stream \(with a write "
                                        r"method\), True or None for stderr, or False for none; "
                                        rf"got {type(progress).__name__}"):
        fetch("data.bin", [server.url + "/file"], DIGEST, folder=tmp_path, progress=progress)
    assert server.requests == [] and list(tmp_path.iterdir()) == []


def test_public_functions_have_docstrings():
    import inspect

    from gradcore.utils import download
    for name, obj in vars(download).items():
        if (not name.startswith("_") and inspect.isfunction(obj)
                and obj.__module__ == download.__name__):
            assert obj.__doc__, f"download.{name} has no docstring"
