"""Fixtures shared by the test modules: archives, image folders, a local HTTP server, tiny
TFRecords, TensorFlow's log messages."""

import functools
import http.server
import logging
import os
import shutil
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import cifar_archives  # noqa: E402
from built_once import built_once, run_temp_dir  # noqa: E402


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session", autouse=True)
def user_cache_of_the_session(tmp_path_factory):
    """A cache directory of the test run's own (the trainer keeps its measured precision
    speeds there, written atomically), so tests neither read nor write the user's and the
    parallel workers measure once."""
    previous = os.environ.get("XDG_CACHE_HOME")
    cache_home = run_temp_dir(tmp_path_factory) / "user-cache"
    cache_home.mkdir(exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = str(cache_home)
    yield
    if previous is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = previous


@pytest.fixture
def http_root(tmp_path):
    """(directory, base_url): files put in directory are served over HTTP on 127.0.0.1."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def cifar_batches():
    """The six official batches, 24 random images each, as dicts with byte-string keys."""
    return cifar_archives.make_batches(images_per_batch=24, seed=1)


@pytest.fixture
def cifar_archive(tmp_path, cifar_batches):
    """(path, md5) of an official-format archive holding `cifar_batches`."""
    path = tmp_path / "archive" / cifar_archives.ARCHIVE_NAME
    path.parent.mkdir()
    md5 = cifar_archives.write_archive_with_md5(str(path), cifar_batches)
    return path, md5


@pytest.fixture(scope="session")
def cifar_image_folders_source(tmp_path_factory):
    """(root, written) of image folders made once: see cifar_archives.write_image_folders."""
    root = tmp_path_factory.mktemp("image_folders") / "cifar10-images"
    return root, cifar_archives.write_image_folders(str(root))


@pytest.fixture
def cifar_image_folders(tmp_path, cifar_image_folders_source):
    """(root, written): a fresh copy of `cifar_image_folders_source`, for a test to change."""
    source, written = cifar_image_folders_source
    root = tmp_path / "cifar10-images"
    shutil.copytree(str(source), str(root))
    return root, written


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory):
    """A data directory with tiny random train/validation/eval TFRecords (64/16/32), made
    once for the test run: a test that changes its files changes a copy."""
    return built_once(tmp_path_factory, "tiny_tfrecords",
                      lambda data_dir: cifar_archives.make_tiny_tfrecords(str(data_dir)))


@pytest.fixture
def tensorflow_info_messages():
    """The messages TensorFlow logs at INFO and above while the test runs."""
    import tensorflow as tf
    messages = []

    class ListHandler(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = tf.get_logger()
    handler = ListHandler(logging.INFO)
    previous_verbosity = tf.compat.v1.logging.get_verbosity()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)
    tf.compat.v1.logging.set_verbosity(previous_verbosity)


# Fixtures of the trained_job plugin: a test that reads the trained job needs its training.
TRAINED_JOB_FIXTURES = {"trained_job", "converted_models"}


def pytest_xdist_auto_num_workers(config):
    """-n auto: a worker more than the cores, as tests often wait on the processes they start."""
    return (os.cpu_count() or 1) + 1


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Every test of the trained job is slow (before -m selects); slow tests go first, so
    that in a parallel run the short ones fill the cores at the end."""
    for item in items:
        if TRAINED_JOB_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)



@pytest.fixture(scope="session", autouse=True)
def xdist_groups_hold(request):
    """A parallel run keeps each xdist_group on one worker, or every test errors saying why."""
    if not getattr(request.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in request.session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        pytest.fail("pytest-xdist did not put the group in the ids of %d tests (%s, ...), so "
                    "--dist loadgroup would spread each group over several workers; install "
                    "the pytest that setup.py's test extra names" % (len(lost), lost[0]),
                    pytrace=False)
