"""download.download: progress, verification, retries and resumed transfers over real HTTP."""

import hashlib
import os
import socket

import pytest

from cifar_archives import ArchiveServer, breaks_first_request_after
from cifar10_estimator.data import download

PAYLOAD = bytes(range(256)) * 800  # 204800 bytes
PAYLOAD_MD5 = hashlib.md5(PAYLOAD).hexdigest()


@pytest.fixture
def retry_delays(monkeypatch):
    """The delays the downloader waited between attempts (without actually waiting)."""
    delays = []
    monkeypatch.setattr(download.time, "sleep", delays.append)
    return delays


def read(path):
    with open(path, "rb") as stream:
        return stream.read()


def closed_port_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d/archive.tar.gz" % probe.getsockname()[1]


def test_downloads_verifies_and_reports_progress_every_ten_percent(tmp_path, capsys):
    payload = PAYLOAD * 10  # large enough that no read skips a tenth
    destination = str(tmp_path / "file")
    with ArchiveServer(payload) as server:
        download.download(server.url, destination, md5=hashlib.md5(payload).hexdigest())

    assert read(destination) == payload
    assert not os.path.exists(destination + ".part")
    assert server.range_headers == [None]
    progress = capsys.readouterr().err.splitlines()
    assert progress[0] == "downloading %s (2.0 MB)" % server.url
    percents = [int(line.split("%")[0]) for line in progress[1:]]
    assert [percent // 10 for percent in percents] == list(range(1, 11))
    assert progress[-1] == "  100% (2.0 MB of 2.0 MB)"


def test_resumes_a_broken_transfer_with_a_range_request(tmp_path, retry_delays):
    destination = str(tmp_path / "file")
    with ArchiveServer(PAYLOAD, bytes_before_break=breaks_first_request_after(50000)) as server:
        download.download(server.url, destination, md5=PAYLOAD_MD5)

    assert read(destination) == PAYLOAD
    assert server.range_headers == [None, "bytes=50000-"]
    assert retry_delays == [1]


def test_resumes_a_partial_file_left_by_an_earlier_run(tmp_path):
    destination = str(tmp_path / "file")
    with open(destination + ".part", "wb") as stream:
        stream.write(PAYLOAD[:1234])
    with ArchiveServer(PAYLOAD) as server:
        download.download(server.url, destination, md5=PAYLOAD_MD5)

    assert read(destination) == PAYLOAD
    assert server.range_headers == ["bytes=1234-"]


def test_restarts_when_the_server_ignores_range(tmp_path, retry_delays):
    destination = str(tmp_path / "file")
    with ArchiveServer(PAYLOAD, bytes_before_break=breaks_first_request_after(50000),
                       honour_range=False) as server:
        download.download(server.url, destination, md5=PAYLOAD_MD5)

    assert read(destination) == PAYLOAD
    assert server.range_headers == [None, "bytes=50000-"]


def test_restarts_when_the_partial_file_is_longer_than_the_file(tmp_path, retry_delays):
    destination = str(tmp_path / "file")
    with open(destination + ".part", "wb") as stream:
        stream.write(PAYLOAD + b"stale tail")
    with ArchiveServer(PAYLOAD) as server:
        download.download(server.url, destination, md5=PAYLOAD_MD5)

    assert read(destination) == PAYLOAD
    assert server.range_headers == ["bytes=%d-" % (len(PAYLOAD) + 10), None]


def test_a_partial_file_that_is_already_complete_is_verified_not_fetched_again(tmp_path):
    destination = str(tmp_path / "file")
    with open(destination + ".part", "wb") as stream:
        stream.write(PAYLOAD)  # an earlier run was stopped before its check
    with ArchiveServer(PAYLOAD) as server:
        download.download(server.url, destination, md5=PAYLOAD_MD5)

    assert read(destination) == PAYLOAD
    assert server.range_headers == ["bytes=%d-" % len(PAYLOAD)]


def test_gives_up_after_max_attempts_and_keeps_the_partial_file_for_a_rerun(tmp_path, retry_delays):
    destination = str(tmp_path / "file")
    with ArchiveServer(PAYLOAD, bytes_before_break=lambda index: 1000) as server:
        with pytest.raises(download.DownloadError, match="gave up after 3 attempts") as error:
            download.download(server.url, destination, md5=PAYLOAD_MD5, max_attempts=3)

    assert server.url in str(error.value)
    assert len(server.range_headers) == 3
    assert retry_delays == [1, 2]
    assert not os.path.exists(destination)
    assert read(destination + ".part") == PAYLOAD[:3000]


def test_checksum_mismatch_removes_the_download(tmp_path):
    destination = str(tmp_path / "file")
    with ArchiveServer(PAYLOAD) as server:
        with pytest.raises(download.ChecksumMismatch) as error:
            download.download(server.url, destination, md5="0" * 32)

    assert PAYLOAD_MD5 in str(error.value) and "0" * 32 in str(error.value)
    assert os.listdir(str(tmp_path)) == []


def test_http_error_status_fails_at_once(tmp_path, http_root, retry_delays):
    _, base_url = http_root
    with pytest.raises(download.DownloadError, match="HTTP error 404"):
        download.download(base_url + "/missing.tar.gz", str(tmp_path / "file"))
    assert retry_delays == []


def test_unreachable_server_fails_after_the_attempts(tmp_path, retry_delays):
    url = closed_port_url()
    with pytest.raises(download.DownloadError, match="cannot download %s: .*refused" % url):
        download.download(url, str(tmp_path / "file"), max_attempts=2)
    assert retry_delays == [1]


@pytest.mark.parametrize("url, problem", [
    ("gopher://example.com/archive", "not an http"),
    ("http://[::1/archive", "Invalid IPv6 URL"),
    ("http:///archive", "names no host"),
])
def test_rejects_urls_it_cannot_fetch(tmp_path, url, problem):
    with pytest.raises(download.DownloadError, match=problem):
        download.download(url, str(tmp_path / "file"))


@pytest.mark.parametrize("make_url, problem", [
    (lambda tmp_path: (tmp_path / "missing.tar.gz").as_uri(), "No such file"),
    (lambda tmp_path: "http://127.0.0.1:port/archive", "nonnumeric port"),
], ids=["missing-file", "bad-port"])
def test_mistakes_in_the_url_fail_at_once_without_retrying(
        tmp_path, retry_delays, make_url, problem):
    with pytest.raises(download.DownloadError, match=problem):
        download.download(make_url(tmp_path), str(tmp_path / "file"), max_attempts=5)
    assert retry_delays == []


def test_a_silent_server_times_out(tmp_path):
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = "http://127.0.0.1:%d/archive.tar.gz" % silent.getsockname()[1]
        with pytest.raises(download.DownloadError, match="timed out"):
            download.download(url, str(tmp_path / "file"), max_attempts=1, timeout_secs=0.2)
