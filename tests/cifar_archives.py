"""Build small CIFAR-10 archives in the official layout and encoding, and tiny TFRecords.

Archives come from cifar10_estimator.data.synthetic_archive, which writes the official
layout and Python 2 pickle encoding (byte-string keys, uint8 data [N, 3072]).
"""

import os

import numpy as np

from cifar10_estimator.data import download
from cifar10_estimator.data import synthetic_archive
from cifar10_estimator.data.cifar10_archive import ARCHIVE_FILENAME as ARCHIVE_NAME  # noqa: F401
from cifar10_estimator.data.cifar10_archive import BATCH_NAMES
# The tests build archives with the package's own official-format writer.
from cifar10_estimator.data.synthetic_archive import (  # noqa: F401
    python2_pickle, random_batch, write_archive)

TRAIN_BATCHES = BATCH_NAMES[:4]
VALIDATION_BATCHES = BATCH_NAMES[4:5]
EVAL_BATCHES = BATCH_NAMES[5:]


def make_batches(images_per_batch=24, seed=0):
    """The six official batches with `images_per_batch` random images each."""
    return synthetic_archive.make_batches(images_per_batch, seed)


def write_archive_with_md5(path, batches, extra_members=()):
    """write_archive, returning the hex MD5 of the file written."""
    write_archive(path, batches, extra_members)
    return download.file_md5(path)


def expected_subsets(batches):
    """(images uint8 [N,3072], labels int [N]) per subset, in record order."""
    def concat(names):
        return (np.concatenate([batches[n][b"data"] for n in names]),
                np.array(sum((batches[n][b"labels"] for n in names), []), dtype=np.int64))
    return {"train": concat(TRAIN_BATCHES),
            "validation": concat(VALIDATION_BATCHES),
            "eval": concat(EVAL_BATCHES)}


def write_tfrecords_the_original_way(data_dir, subsets, write_metadata=True):
    """Write subset TFRecords one tf.train.Example at a time, as the original tutorial did.

    Args:
      data_dir: output directory.
      subsets: dict subset -> (images uint8 [N,3072], labels [N]).
      write_metadata: also write the counts file the package's converter writes.
    """
    import tensorflow as tf
    from cifar10_estimator import tfrecord_format

    os.makedirs(data_dir, exist_ok=True)
    for subset, (images, labels) in subsets.items():
        with tf.io.TFRecordWriter(tfrecord_format.tfrecord_path(data_dir, subset)) as writer:
            for image, label in zip(images, labels):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                }))
                writer.write(example.SerializeToString())
    if write_metadata:
        tfrecord_format.write_metadata(
            data_dir, {subset: len(labels) for subset, (_, labels) in subsets.items()})


def make_tiny_tfrecords(data_dir, num_train=64, num_validation=16, num_eval=32, seed=0):
    """Random tiny TFRecords for model and CLI tests; returns the subsets written."""
    rng = np.random.RandomState(seed)
    subsets = {}
    for subset, count in (("train", num_train), ("validation", num_validation), ("eval", num_eval)):
        subsets[subset] = (rng.randint(0, 256, size=(count, 3072)).astype(np.uint8),
                           rng.randint(0, 10, size=count).astype(np.int64))
    write_tfrecords_the_original_way(data_dir, subsets)
    return subsets


class ArchiveServer:
    """Serves one payload over HTTP on 127.0.0.1, with Range support and optional breakage.

    Args:
      payload: the bytes served at every path.
      bytes_before_break: function(request index) -> body bytes to send before
        dropping the connection, or None to send the whole body; default never breaks.
      honour_range: answer `Range: bytes=N-` with 206 (False: always the whole file).

    Use as a context manager. `url` is the payload's address; `range_headers` lists
    the Range header of each request received (None when there was none).
    """

    def __init__(self, payload, bytes_before_break=None, honour_range=True):
        import http.server
        import threading

        self.payload = payload
        self.range_headers = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server._answer(self)

            def log_message(self, *args):
                pass

        self._bytes_before_break = bytes_before_break or (lambda index: None)
        self._honour_range = honour_range
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self.url = "http://127.0.0.1:%d/%s" % (self._httpd.server_address[1], ARCHIVE_NAME)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._httpd.shutdown()
        self._httpd.server_close()

    def _answer(self, handler):
        import re
        import socket

        range_header = handler.headers.get("Range")
        request_index = len(self.range_headers)
        self.range_headers.append(range_header)
        match = re.fullmatch(r"bytes=(\d+)-", range_header or "")
        start = int(match.group(1)) if match and self._honour_range else 0
        if start >= len(self.payload) and start:
            handler.send_response(416)  # with the file's size, as RFC 7233 asks
            handler.send_header("Content-Range", "bytes */%d" % len(self.payload))
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        if start:
            handler.send_response(206)
            handler.send_header("Content-Range", "bytes %d-%d/%d"
                                % (start, len(self.payload) - 1, len(self.payload)))
        else:
            handler.send_response(200)
        body = self.payload[start:]
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        cut = self._bytes_before_break(request_index)
        handler.wfile.write(body if cut is None else body[:cut])
        if cut is not None:
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)


def breaks_first_request_after(num_bytes):
    """An ArchiveServer `bytes_before_break` that drops only the first response after num_bytes."""
    return lambda request_index: num_bytes if request_index == 0 else None
