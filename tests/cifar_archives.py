"""Build small CIFAR-10 archives in the official layout and encoding, and tiny TFRecords.

The official `cifar-10-python.tar.gz` holds `cifar-10-batches-py/` with Python 2
pickles (protocol 2) whose dict keys and strings are Python 2 `str`, i.e. bytes
when read by Python 3 with encoding='bytes'; `data` is a uint8 numpy array Nx3072
(channel-major) and `labels` a list of ints. `Python2Pickler` writes the same
opcodes Python 2's pickler wrote, so loaders are tested on the real encoding.
"""

import hashlib
import io
import os
import pickle
import struct
import tarfile

import numpy as np

BATCH_NAMES = ("data_batch_1", "data_batch_2", "data_batch_3",
               "data_batch_4", "data_batch_5", "test_batch")
TRAIN_BATCHES = BATCH_NAMES[:4]
VALIDATION_BATCHES = BATCH_NAMES[4:5]
EVAL_BATCHES = BATCH_NAMES[5:]
ARCHIVE_NAME = "cifar-10-python.tar.gz"
TOP_DIRECTORY = "cifar-10-batches-py"
LABEL_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer",
               b"dog", b"frog", b"horse", b"ship", b"truck"]


class Python2Pickler(pickle._Pickler):
    """A protocol-2 pickler that writes bytes and ASCII text as Python 2 `str` does.

    Python 3 pickles bytes at protocol 2 through `_codecs.encode`; Python 2 wrote
    SHORT_BINSTRING / BINSTRING opcodes, which Python 3 reads back as bytes with
    encoding='bytes'. The CIFAR-10 batches were written by Python 2.
    """

    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, stream):
        super().__init__(stream, protocol=2)

    def save_py2_str(self, data):
        if isinstance(data, str):
            data = data.encode("ascii")
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(data)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def python2_pickle(obj):
    stream = io.BytesIO()
    Python2Pickler(stream).dump(obj)
    return stream.getvalue()


def random_batch(num_images, seed, batch_label):
    """A batch dict as in the official files, with random pixels and labels."""
    rng = np.random.RandomState(seed)
    data = rng.randint(0, 256, size=(num_images, 3072)).astype(np.uint8)
    labels = [int(x) for x in rng.randint(0, 10, size=num_images)]
    return {
        b"batch_label": batch_label.encode("ascii"),
        b"labels": labels,
        b"data": data,
        b"filenames": [("image_%s_%05d.png" % (seed, i)).encode("ascii")
                       for i in range(num_images)],
    }


def make_batches(images_per_batch=24, seed=0):
    """Dict batch name -> batch dict for the six official batches."""
    return {
        name: random_batch(images_per_batch, seed * 100 + index,
                           "batch %d of 6" % (index + 1))
        for index, name in enumerate(BATCH_NAMES)
    }


def write_archive(path, batches, extra_members=()):
    """Write a gzip tar in the official layout.

    Args:
      path: archive file to write.
      batches: dict batch name -> batch dict (or raw bytes to store as is).
      extra_members: (tarinfo, bytes-or-None) pairs appended after the batches.

    Returns:
      hex MD5 of the archive file.
    """
    members = {"batches.meta": python2_pickle({
        b"label_names": LABEL_NAMES, b"num_cases_per_batch": 10000, b"num_vis": 3072})}
    for name, batch in batches.items():
        members[name] = batch if isinstance(batch, bytes) else python2_pickle(batch)
    members["readme.html"] = b"<html>synthetic CIFAR-10 for tests</html>\n"
    with tarfile.open(path, "w:gz") as archive:
        directory = tarfile.TarInfo(TOP_DIRECTORY)
        directory.type = tarfile.DIRTYPE
        directory.mode = 0o755
        archive.addfile(directory)
        for name, payload in members.items():
            info = tarfile.TarInfo("%s/%s" % (TOP_DIRECTORY, name))
            info.size = len(payload)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(payload))
        for info, payload in extra_members:
            archive.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return md5_of(path)


def md5_of(path):
    digest = hashlib.md5()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
            handler.send_error(416)
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
