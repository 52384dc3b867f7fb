"""Build small CIFAR-10 archives in the official layout and encoding, tiny TFRecords, and
folders of images in the layout of the public CIFAR-10-images repository.

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
    from cifar10_estimator.data import tfrecord_format

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


def read_tfrecords(path):
    """(images uint8 [N, 3072], labels int64 [N]) parsed back the way the training reads them."""
    import tensorflow as tf
    from cifar10_estimator.data import tfrecord_format

    features = {tfrecord_format.IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
                tfrecord_format.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        return (tf.io.decode_raw(example[tfrecord_format.IMAGE_KEY], tf.uint8),
                example[tfrecord_format.LABEL_KEY])

    batches = list(tf.data.TFRecordDataset(path).map(parse).batch(1024).as_numpy_iterator())
    return (np.concatenate([images for images, _ in batches]),
            np.concatenate([labels for _, labels in batches]))


def make_tiny_tfrecords(data_dir, num_train=64, num_validation=16, num_eval=32, seed=0):
    """Random tiny TFRecords for model and CLI tests; returns the subsets written."""
    rng = np.random.RandomState(seed)
    subsets = {}
    for subset, count in (("train", num_train), ("validation", num_validation), ("eval", num_eval)):
        subsets[subset] = (rng.randint(0, 256, size=(count, 3072)).astype(np.uint8),
                           rng.randint(0, 10, size=count).astype(np.int64))
    write_tfrecords_the_original_way(data_dir, subsets)
    return subsets


# Images of the image folders that are not RGB, or not named NNNN.png/NNNN.jpg:
# (split folder, class, index) -> (Pillow mode, file extension).
SPECIAL_FOLDER_IMAGES = {
    ("train", "airplane", 1): ("L", ".png"),      # grayscale PNG
    ("train", "automobile", 1): ("RGBA", ".png"),  # alpha to drop
    ("train", "bird", 1): ("L", ".jpg"),          # grayscale JPEG
    ("train", "cat", 2): ("RGB", ".jpeg"),
    ("test", "dog", 1): ("RGB", ".JPG"),
}


def _random_pillow_image(rng, mode):
    from PIL import Image

    if mode == "L":
        return Image.fromarray(rng.randint(0, 256, size=(32, 32)).astype(np.uint8), "L")
    channels = {"RGB": 3, "RGBA": 4}[mode]
    return Image.fromarray(rng.randint(0, 256, size=(32, 32, channels)).astype(np.uint8), mode)


def write_image_folders(root, train_per_class=5, test_per_class=2, seed=0):
    """Write root/train/<class>/ and root/test/<class>/ of random 32x32 images with Pillow.

    Images are named 0000, 0001, ... and alternate RGB PNG (even) and RGB JPEG (odd),
    except SPECIAL_FOLDER_IMAGES. Beside them, as in real folders: hidden files
    (.DS_Store in class and split folders, a .git folder) and a README.md in root.

    Returns:
      dict split folder ('train', 'test') -> list of (path relative to root, label,
      Pillow mode) in class, then file-name order.
    """
    from cifar10_estimator import cifar10

    rng = np.random.RandomState(seed)
    os.makedirs(os.path.join(root, ".git"))
    with open(os.path.join(root, "README.md"), "w") as stream:
        stream.write("CIFAR-10 images\n")
    written = {}
    for split, per_class in (("train", train_per_class), ("test", test_per_class)):
        written[split] = []
        for label, class_name in enumerate(cifar10.CLASS_NAMES):
            folder = os.path.join(root, split, class_name)
            os.makedirs(folder)
            for index in range(per_class):
                mode, extension = SPECIAL_FOLDER_IMAGES.get(
                    (split, class_name, index), ("RGB", ".jpg" if index % 2 else ".png"))
                relative_path = "%s/%s/%04d%s" % (split, class_name, index, extension)
                _random_pillow_image(rng, mode).save(
                    os.path.join(root, relative_path),
                    format="JPEG" if extension.lower() in (".jpg", ".jpeg") else "PNG")
                written[split].append((relative_path, label, mode))
            with open(os.path.join(folder, ".DS_Store"), "wb") as stream:
                stream.write(b"\0Bud1")
        with open(os.path.join(root, split, ".DS_Store"), "wb") as stream:
            stream.write(b"\0Bud1")
    return written


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
