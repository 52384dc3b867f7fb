"""Files written whole: under a temporary name beside them, then renamed; with the mode of
any new file; a killed writer's leftovers told apart from other files."""

import contextlib
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from cifar10_estimator import files
from cifar10_estimator.curves import plot
from cifar10_estimator.data import synthetic_archive, tfrecord_format
from cifar10_estimator.serving import convert
from cli_helpers import REPO_ROOT, cli_env


@contextlib.contextmanager
def umask(mask):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


class SameOutputs:
    """A runner standing in for a model file's runtime and for the SavedModel alike."""

    path = "same"
    runtime = "a test"

    def predict(self, images):
        probabilities = np.full((len(images), 10), 0.1, np.float32)
        return {"classes": np.zeros(len(images), np.int64), "probabilities": probabilities}


def write_png(path):
    pyplot = plot._pyplot()
    fig = pyplot.figure(figsize=(1, 1))
    plot.save_png(fig, path)
    pyplot.close(fig)


def write_tfrecords(path):
    tfrecord_format.write_tfrecords(path, np.zeros((1, 3072), np.uint8), np.zeros(1, np.int64))


def write_json(path):
    files.write_json(path, {"accuracy": 0.9})


def write_converted_model(path):
    target = dataclasses.replace(convert.TARGETS["tflite"], runner=lambda _: SameOutputs())
    convert.write_checked(b"a model", path, target, SameOutputs(), convert.random_images(2),
                          "random images")


def write_archive(path):
    synthetic_archive.main(["--output", path, "--images-per-batch", "2"])


@pytest.mark.parametrize("write", [write_png, write_tfrecords, write_json,
                                   write_converted_model, write_archive])
def test_each_writer_gives_its_file_the_mode_of_a_plain_open_and_leaves_no_temporary(
        tmp_path, write):
    with umask(0o027):
        write(str(tmp_path / "written"))
        with open(str(tmp_path / "plain"), "w"):
            pass
    modes = {name: os.stat(str(tmp_path / name)).st_mode & 0o777 for name in ("written", "plain")}
    assert modes == {"written": 0o640, "plain": 0o640}
    assert sorted(os.listdir(str(tmp_path))) == ["plain", "written"]


def test_a_block_that_raises_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with files.written_whole(str(path)) as temporary:
            with open(temporary, "w") as stream:
                stream.write("half")
            raise KeyboardInterrupt
    assert path.read_text() == "old"
    assert os.listdir(str(tmp_path)) == ["results.json"]


def test_each_writer_has_a_temporary_of_its_own_told_apart_from_other_files(tmp_path):
    path = str(tmp_path / "hparams.json")
    first, second = files.temporary_path(path), files.temporary_path(path)
    assert first != second and os.path.dirname(first) == str(tmp_path)
    assert files.is_temporary_of(os.path.basename(first), "hparams.json")
    for name in ("hparams.json", ".hparams.json.swp", ".notes.tmp", "hparams.json.tmp",
                 os.path.basename(files.temporary_path(str(tmp_path / "hparams")))):
        assert not files.is_temporary_of(name, "hparams.json"), name


def test_a_local_file_is_written_whole_without_loading_tensorflow(tmp_path):
    program = ("import sys\n"
               "from cifar10_estimator import files\n"
               "files.write_json(sys.argv[1], {'a': 1})\n"
               "print('tensorflow' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", program, str(tmp_path / "a.json")],
                            cwd=REPO_ROOT, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
    assert (tmp_path / "a.json").read_text() == '{\n  "a": 1\n}\n'
