"""get_file and cache_dir (DeZero's dezero.utils names) against a real HTTP server on the
loopback address."""
import hashlib
import http.server
import threading

import pytest

from gradcore import utils
from gradcore.utils.download import DownloadError

BODY = b"{0: 'tench', 1: 'goldfish'}\n" * 100
DIGEST = hashlib.sha256(BODY).hexdigest()


@pytest.fixture
def server():
    """Serves BODY at /data/labels.txt; `hits` counts the requests."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            if self.path != "/data/labels.txt":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

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
    assert utils.cache_dir == str(tmp_path / "cache")  # follows $GRADCORE_DATA, read when asked
    url = server.url + "/data/labels.txt"
    path = utils.get_file(url, sha256=DIGEST, progress=False)
    assert path == str(tmp_path / "cache" / "labels.txt")
    assert open(path, "rb").read() == BODY and len(server.hits) == 1
    assert utils.get_file(url, sha256=DIGEST.upper(), progress=False) == path
    assert utils.get_file(url) == path  # no checksum: the file already there is used
    assert len(server.hits) == 1
    named = utils.get_file(url, "other.txt", sha256=DIGEST, progress=False)
    assert named == str(tmp_path / "cache" / "other.txt") and len(server.hits) == 2


def test_get_file_without_a_checksum_downloads_nothing(server, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADCORE_DATA", str(tmp_path))
    with pytest.raises(ValueError, match=r"gradcore checks each download by its SHA-256, so "
                       r"pass sha256='\.\.\.' .*or put the file at .*labels\.txt yourself"):
        utils.get_file(server.url + "/data/labels.txt")
    assert server.hits == []
    with pytest.raises(DownloadError, match="could not download labels.txt"):
        utils.get_file(server.url + "/data/labels.txt", sha256="0" * 64, progress=False)
    assert not (tmp_path / "labels.txt").exists()
    with pytest.raises(ValueError, match=r"the file name '' is not a name for a file"):
        utils.get_file(server.url + "/data/")
