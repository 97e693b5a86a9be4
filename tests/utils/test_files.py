"""get_file and cache_dir (DeZero's dezero.utils names) against a real HTTP server on the
loopback address."""
import hashlib
import http.server
import threading

import pytest

from gradcore import utils
from gradcore.utils.download import DownloadError, fetch

BODY = b"{0: 'tench', 1: 'goldfish'}\n" * 100
DIGEST = hashlib.sha256(BODY).hexdigest()
OTHER = b"{0: 'cat', 1: 'dog'}\n" * 100  # another data set's labels.txt
OTHER_DIGEST = hashlib.sha256(OTHER).hexdigest()
SERVED = {"/data/labels.txt": BODY, "/other/labels.txt": OTHER}


@pytest.fixture
def server():
    """Serves SERVED (two files named labels.txt); `hits` counts the requests."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            if self.path not in SERVED:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(SERVED[self.path])))
            self.end_headers()
            self.wfile.write(SERVED[self.path])

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url, httpd.hits = f"http://127.0.0.1:{httpd.server_address[1]}", hits
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_get_file_downloads_once_into_the_cache_folder(server, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path / "cache"))
    # the folder get_file keeps its files in, as DeZero's; follows $GRADCORE_DATA, read when asked
    assert utils.cache_dir == str(tmp_path / "cache" / "files")
    url = server.url + "/data/labels.txt"
    path = utils.get_file(url, sha256=DIGEST, progress=False)
    assert path == str(tmp_path / "cache" / "files" / DIGEST[:16] / "labels.txt")
    assert open(path, "rb").read() == BODY and len(server.hits) == 1
    assert utils.get_file(url, sha256=DIGEST.upper(), progress=False) == path
    assert utils.get_file(url) == path  # no checksum: the file already there is used
    assert len(server.hits) == 1
    named = utils.get_file(url, "other.txt", sha256=DIGEST, progress=False)
    assert named == str(tmp_path / "cache" / "files" / DIGEST[:16] / "other.txt")
    assert len(server.hits) == 2


def test_get_file_without_a_checksum_takes_a_file_put_in_cache_dir_by_hand(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "labels.txt").write_bytes(BODY)  # as DeZero's users put files offline
    assert utils.get_file("http://127.0.0.1:1/data/labels.txt") == str(tmp_path / "files" /
                                                                        "labels.txt")


def test_a_file_put_in_cache_dir_by_hand_is_used_when_its_checksum_is_the_one_given(
        server, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    (tmp_path / "files").mkdir()
    by_hand = tmp_path / "files" / "labels.txt"
    by_hand.write_bytes(BODY)
    url = server.url + "/data/labels.txt"
    assert utils.get_file(url, sha256=DIGEST, progress=False) == str(by_hand)
    assert server.hits == []  # nothing downloaded
    other = hashlib.sha256(b"another file").hexdigest()  # not the file by hand: downloaded, and
    with pytest.raises(DownloadError):  # the server's file is not that one either
        utils.get_file(url, sha256=other, progress=False)
    assert utils.get_file(url) == str(by_hand)  # without a checksum the file by hand comes first


def test_two_urls_ending_in_one_name_keep_a_file_each(server, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    first = utils.get_file(server.url + "/data/labels.txt", sha256=DIGEST, progress=False)
    second = utils.get_file(server.url + "/other/labels.txt", sha256=OTHER_DIGEST,
                            progress=False)
    assert first != second
    assert open(first, "rb").read() == BODY and open(second, "rb").read() == OTHER
    with pytest.raises(ValueError, match=r"get_file\(.*\): 2 files named 'labels.txt' are kept:"
                       r"\n  .*\n  .*\nPass sha256='...' to say which .* or keep each URL's "
                       r"file under a name of its own with file_name='...'"):
        utils.get_file(server.url + "/other/labels.txt")  # either could be the one meant
    assert utils.get_file(server.url + "/other/labels.txt", sha256=OTHER_DIGEST) == second
    assert len(server.hits) == 2


def test_get_file_keeps_clear_of_the_datasets_folders(server, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    (tmp_path / "mnist").mkdir()  # as MNIST() made it
    path = utils.get_file(server.url + "/data/labels.txt", "mnist", sha256=DIGEST,
                          progress=False)
    assert open(path, "rb").read() == BODY and len(server.hits) == 1
    assert (tmp_path / "mnist").is_dir()
    # and a dataset still downloads into its folder after get_file kept a file named like it
    fetched = fetch("labels.txt", server.url + "/data/labels.txt", DIGEST,
                    folder=tmp_path / "mnist", progress=False)
    assert fetched == tmp_path / "mnist" / "labels.txt"


def test_a_null_character_in_the_urls_name_is_an_error_naming_get_file(server, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    url = server.url + "/data/a%00b.txt"  # os calls would say only "embedded null byte"
    for sha256 in (DIGEST, None):
        with pytest.raises(ValueError, match=rf"^get_file\('{url}'\): the file name "
                                             r"'a\\x00b.txt' holds a null character, which no "
                                             r"file name can; pass file_name='...'$"):
            utils.get_file(url, sha256=sha256, progress=False)
    assert server.hits == [] and not (tmp_path / "files").exists()  # refused before a request


def test_get_file_without_a_checksum_downloads_nothing(server, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    with pytest.raises(ValueError, match=r"gradcore checks each download by its SHA-256, so "
                       r"pass sha256='\.\.\.' .*or put the file at .*labels\.txt yourself"):
        utils.get_file(server.url + "/data/labels.txt")
    assert server.hits == []
    with pytest.raises(DownloadError, match="could not download labels.txt"):
        utils.get_file(server.url + "/data/labels.txt", sha256="0" * 64, progress=False)
    assert list(tmp_path.rglob("labels.txt*")) == []
    with pytest.raises(ValueError, match=r"the file name '' is not a name for a file"):
        utils.get_file(server.url + "/data/")
