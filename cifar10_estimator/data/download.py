"""Fetch one file over HTTP with progress, bounded retries, resume and an MD5 check.

Only the standard library's urllib is used. A broken transfer is resumed from
`<path>.part` with an HTTP Range request; a server that ignores Range sends the
whole file again and the download restarts. The file appears under its final
name only once it is complete and verified.
"""

import hashlib
import http.client
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from cifar10_estimator.cli.terminal import is_terminal
from cifar10_estimator.errors import Cifar10EstimatorError

CHUNK_BYTES = 1 << 16
MAX_RETRY_DELAY_SECS = 30
_SUPPORTED_SCHEMES = ("http", "https", "ftp", "file")
# Server answers worth retrying: timeouts, rate limits, server-side failures.
_TRANSIENT_HTTP_STATUSES = (408, 429, 500, 502, 503, 504)
_RANGE_NOT_SATISFIABLE = 416


class DownloadError(Cifar10EstimatorError):
    """The file could not be fetched: network, server or protocol failure."""


class ChecksumMismatch(Cifar10EstimatorError):
    """The fetched file is complete but is not the expected file."""


class _IncompleteTransfer(Exception):
    """The server closed the response before sending everything it announced."""


def file_md5(path):
    """Hex MD5 digest of a file's contents."""
    digest = hashlib.md5()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(url, path, md5=None, max_attempts=5, timeout_secs=60, progress_stream=None):
    """Download `url` to `path`, retrying and resuming broken transfers.

    Args:
      url: http, https, ftp or file URL.
      path: destination file; it appears only once complete and verified.
      md5: expected hex MD5 of the file, or None to skip verification.
      max_attempts: requests to make before giving up (at least 1).
      timeout_secs: socket timeout for connecting and for each read.
      progress_stream: text stream for progress lines, default sys.stderr.

    Raises:
      DownloadError: the URL is unusable, the server refused it, or every attempt
        broke; a partial download stays in `<path>.part` so a rerun resumes it.
      ChecksumMismatch: the download completed with another MD5; it was removed.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1, got %r" % max_attempts)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as error:
        raise DownloadError("cannot download %r: %s" % (url, error))
    scheme = parts.scheme.lower()
    if scheme in ("http", "https") and not parts.hostname:
        raise DownloadError("cannot download %r: the URL names no host" % url)
    if scheme not in _SUPPORTED_SCHEMES:
        raise DownloadError("cannot download %r: not an %s URL"
                            % (url, "/".join(_SUPPORTED_SCHEMES)))
    stream = progress_stream or sys.stderr
    partial = path + ".part"
    for attempt in range(1, max_attempts + 1):
        try:
            _fetch(url, partial, timeout_secs, stream)
            break
        except (OSError, http.client.HTTPException, _IncompleteTransfer) as error:
            if _is_range_refusal(error) and os.path.exists(partial):
                if _refused_range_total(error) == os.path.getsize(partial):
                    break  # an earlier run fetched every byte; only the check is left
                # The partial file is longer than the file on the server: start over.
                os.remove(partial)
            elif not _is_transient(error):
                raise DownloadError("cannot download %s: %s" % (url, _reason(error)))
            if attempt == max_attempts:
                raise DownloadError("cannot download %s: %s (gave up after %d attempt%s)"
                                    % (url, _reason(error), attempt, "" if attempt == 1 else "s"))
            delay_secs = min(2 ** (attempt - 1), MAX_RETRY_DELAY_SECS)
            print("download interrupted (%s); retrying in %d s" % (_reason(error), delay_secs),
                  file=stream)
            time.sleep(delay_secs)
    _verify(partial, url, md5)
    os.replace(partial, path)


def _fetch(url, partial, timeout_secs, stream):
    """One request: append the rest of the file to `partial`, or rewrite it from the start."""
    done_bytes = os.path.getsize(partial) if os.path.exists(partial) else 0
    headers = {"Range": "bytes=%d-" % done_bytes} if done_bytes else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_secs) as response:
        if done_bytes and getattr(response, "status", None) == 206:
            start, total_bytes = _content_range(response.headers.get("Content-Range"))
            if start != done_bytes:
                os.remove(partial)
                raise _IncompleteTransfer("server sent bytes from %s, not from %d; restarting"
                                          % (start, done_bytes))
            if total_bytes is None:
                total_bytes = _content_length(response, done_bytes)
            mode = "ab"
        else:
            # No range asked for, or the server ignored it and sends the whole file.
            done_bytes = 0
            total_bytes = _content_length(response, 0)
            mode = "wb"
        try:
            output = open(partial, mode)
        except OSError as error:
            raise Cifar10EstimatorError("cannot write %s: %s" % (partial, error.strerror or error))
        progress = _Progress(stream, url, total_bytes, done_bytes)
        with output:
            try:
                for chunk in iter(lambda: response.read(CHUNK_BYTES), b""):
                    output.write(chunk)
                    done_bytes += len(chunk)
                    progress.update(done_bytes)
            finally:
                progress.finish()
    if total_bytes is not None and done_bytes != total_bytes:
        raise _IncompleteTransfer("connection closed after %d of %d bytes"
                                  % (done_bytes, total_bytes))


def _content_range(header):
    """(first byte, total size or None) from a `bytes first-last/total` header."""
    try:
        unit, _, spec = header.strip().partition(" ")
        span, _, total = spec.partition("/")
        if unit != "bytes":
            raise ValueError(unit)
        return int(span.partition("-")[0]), (None if total == "*" else int(total))
    except (AttributeError, ValueError):
        raise _IncompleteTransfer("unreadable Content-Range header %r" % (header,))


def _content_length(response, offset):
    """Final file size announced by the response (body length + offset), or None."""
    length = response.headers.get("Content-Length")
    return offset + int(length) if length and length.strip().isdigit() else None


def _is_range_refusal(error):
    return isinstance(error, urllib.error.HTTPError) and error.code == _RANGE_NOT_SATISFIABLE


def _refused_range_total(error):
    """The file size a 416 response announces (`Content-Range: bytes */N`), or None."""
    match = re.fullmatch(r"bytes \*/(\d+)", (error.headers.get("Content-Range") or "").strip())
    return int(match.group(1)) if match else None


def _is_transient(error):
    """Whether retrying can help: network failures yes, most HTTP error statuses no."""
    if isinstance(error, urllib.error.HTTPError):
        return error.code in _TRANSIENT_HTTP_STATUSES
    if isinstance(error, http.client.InvalidURL):
        return False
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    # A file:// path that is missing or unreadable will not appear by retrying.
    return not isinstance(reason, (FileNotFoundError, PermissionError, IsADirectoryError,
                                   NotADirectoryError))


def _reason(error):
    if isinstance(error, urllib.error.HTTPError):
        return "HTTP error %d %s" % (error.code, error.reason)
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__


def _verify(partial, url, md5):
    if md5 is None:
        return
    actual = file_md5(partial)
    if actual != md5.lower():
        os.remove(partial)
        raise ChecksumMismatch(
            "the file downloaded from %s has MD5 %s, expected %s; removed it"
            % (url, actual, md5.lower()))


class _Progress:
    """Reports progress on a stream: in place on a terminal, else one line per 10%."""

    _UNKNOWN_SIZE_STEP_BYTES = 10 << 20

    def __init__(self, stream, url, total_bytes, done_bytes):
        self._stream = stream
        self._total_bytes = total_bytes
        self._interactive = is_terminal(stream)
        self._percent_step = 1 if self._interactive else 10
        self._last_step = self._step(done_bytes)
        size = _megabytes(total_bytes) if total_bytes is not None else "size unknown"
        resuming = ", resuming at %s" % _megabytes(done_bytes) if done_bytes else ""
        print("downloading %s (%s%s)" % (url, size, resuming), file=stream)

    def _step(self, done_bytes):
        if self._total_bytes:
            return done_bytes * 100 // self._total_bytes // self._percent_step
        return done_bytes // self._UNKNOWN_SIZE_STEP_BYTES

    def update(self, done_bytes):
        step = self._step(done_bytes)
        if step <= self._last_step:
            return
        self._last_step = step
        if self._total_bytes:
            line = "  %3d%% (%s of %s)" % (done_bytes * 100 // self._total_bytes,
                                         _megabytes(done_bytes), _megabytes(self._total_bytes))
        else:
            line = "  %s" % _megabytes(done_bytes)
        if self._interactive:
            self._stream.write("\r" + line)
            self._stream.flush()
        else:
            print(line, file=self._stream)

    def finish(self):
        if self._interactive:
            self._stream.write("\n")
            self._stream.flush()


def _megabytes(num_bytes):
    return "%.1f MB" % (num_bytes / 1e6)
