"""The predict command: image files in, PATH<TAB>CLASS<TAB>PROBABILITY lines out."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import cifar10
from cifar10_estimator.serving import export
from cli_helpers import assert_one_line_error, run_module

pytest_plugins = ["trained_job"]
slow = pytest.mark.slow

MODULE = "cifar10_estimator.serving.predict"


def write_image(path, height, width, encode, seed):
    """Write a random RGB image of height x width with `encode`; return its pixels."""
    pixels = np.random.RandomState(seed).randint(0, 256, (height, width, 3)).astype(np.uint8)
    path.write_bytes(encode(pixels).numpy())
    return pixels


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
    """A PNG and a JPEG, neither 32x32; the tests only read them."""
    directory = tmp_path_factory.mktemp("images")
    png = directory / "wide.png"
    jpeg = directory / "small photo.jpg"
    write_image(png, 45, 70, tf.io.encode_png, seed=1)
    write_image(jpeg, 20, 24, lambda pixels: tf.io.encode_jpeg(pixels, quality=90), seed=2)
    return [png, jpeg]


@pytest.fixture(scope="module")
def unreadable_files(tmp_path_factory):
    """(a .png that is text, an empty .png, a .jpg that does not exist)."""
    directory = tmp_path_factory.mktemp("unreadable")
    not_an_image = directory / "notes.png"
    not_an_image.write_text("not an image\n")
    empty = directory / "empty.png"
    empty.write_bytes(b"")
    return not_an_image, empty, directory / "missing.jpg"


@pytest.fixture(scope="module")
def expected_rankings(trained_job, image_files):
    """{path: [(class name, probability)], most probable first} of serving_default of the
    newest export under export/best on each image file, decoded as TensorFlow decodes it
    and resized as the export documents."""
    export_dir = trained_job.exports("best")[-1]
    rankings = {}
    for path in image_files:
        image = tf.io.decode_image(path.read_bytes(), channels=3, expand_animations=False)
        # One image at a time, as predict classifies them.
        resized = export.resize_to_cifar(image).numpy()[np.newaxis]
        probabilities = trained_job.serve_images(export_dir, resized)["probabilities"][0]
        order = np.argsort(-probabilities, kind="stable")
        rankings[path] = [(cifar10.CLASS_NAMES[index], probabilities[index])
                          for index in order]
    return rankings


def parse_lines(stdout):
    rows = [line.split("\t") for line in stdout.splitlines()]
    assert all(len(row) == 3 for row in rows), stdout
    return [(path, name, float(probability)) for path, name, probability in rows]


def assert_top_k_rows(rows, image_files, expected_rankings, k):
    """rows hold k lines per image, in the images' order, ranked as expected."""
    assert len(rows) == k * len(image_files)
    for index, path in enumerate(image_files):
        image_rows = rows[k * index:k * index + k]
        assert {row[0] for row in image_rows} == {str(path)}
        expected = expected_rankings[path][:k]
        assert [name for _, name, _ in image_rows] == [name for name, _ in expected]
        np.testing.assert_allclose([p for _, _, p in image_rows], [p for _, p in expected],
                                   atol=2e-6)


@pytest.fixture(scope="module")
def saved_model_predictions(trained_job, image_files, unreadable_files):
    """One predict of the job dir's SavedModel with --top-k 3 on the two images with the
    unreadable files between them: the tests below each check part of what it did (each
    TensorFlow process costs seconds before it reads an image)."""
    not_an_image, empty, missing = unreadable_files
    return run_module(MODULE, ["--export-dir", trained_job.job_dir, "--top-k", "3",
                               image_files[0], not_an_image, empty, missing, image_files[1]])


@slow
def test_top_k_prints_k_lines_per_png_and_jpeg_file_of_any_size_most_probable_first(
        saved_model_predictions, image_files, expected_rankings):
    # Given a job dir, predict uses the newest export under export/best (expected_rankings).
    # Predict finds the export with export_dirs.resolve_export_dir, whose other forms (an
    # export, a directory of timestamped exports) test_export checks; one line per image
    # without --top-k, the int8 test below.
    assert_top_k_rows(parse_lines(saved_model_predictions.stdout), image_files,
                      expected_rankings, 3)


@slow
def test_unreadable_images_are_reported_and_the_others_still_answered(
        saved_model_predictions, image_files, unreadable_files):
    result = saved_model_predictions
    not_an_image, empty, missing = unreadable_files
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert [path for path, _, _ in parse_lines(result.stdout)] == [
        str(image_files[0])] * 3 + [str(image_files[1])] * 3
    errors = [line for line in result.stderr.splitlines()
              if line.startswith("python -m %s: error:" % MODULE)]
    assert len(errors) == 3, result.stderr[-3000:]
    assert str(not_an_image) in errors[0] and "cannot decode" in errors[0]
    assert str(empty) in errors[1] and "cannot decode" in errors[1]
    assert str(missing) in errors[2] and "no such file" in errors[2]


@slow
def test_an_export_dir_without_exports_is_a_one_line_error(tmp_path, image_files):
    result = run_module(MODULE, ["--export-dir", tmp_path] + image_files)
    assert_one_line_error(result, 1, "no SavedModel in %s" % tmp_path)


def test_top_k_beyond_the_ten_classes_is_a_usage_error(tmp_path, image_files):
    result = run_module(MODULE, ["--export-dir", tmp_path, "--top-k", "11"] + image_files)
    assert_one_line_error(result, 2, "--top-k must be between 1 and 10")


@slow
@pytest.mark.parametrize("to", ["tflite", "onnx"])
def test_a_float_model_file_ranks_as_the_export_does(converted_models, to, image_files,
                                                     expected_rankings):
    result = run_module(MODULE, ["--model", converted_models[to].path, "--top-k", "3"]
                        + image_files)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_top_k_rows(parse_lines(result.stdout), image_files, expected_rankings, 3)


@slow
def test_an_int8_model_file_answers_with_a_probability_per_image(converted_models,
                                                                 image_files):
    result = run_module(MODULE, ["--model", converted_models["tflite-int8"].path]
                        + image_files)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = parse_lines(result.stdout)
    # Without --top-k, one line per image.
    assert [path for path, _, _ in rows] == [str(path) for path in image_files]
    assert all(name in cifar10.CLASS_NAMES and 0 < probability <= 1
               for _, name, probability in rows)


@slow
def test_a_missing_model_file_is_a_one_line_error(tmp_path, image_files):
    path = tmp_path / "model.onnx"
    result = run_module(MODULE, ["--model", path] + image_files)
    assert_one_line_error(result, 1, "model file %s does not exist" % path)


def test_an_export_dir_and_a_model_file_together_are_a_usage_error(tmp_path, image_files):
    result = run_module(MODULE, ["--model", tmp_path / "model.onnx", "--export-dir", tmp_path]
                        + image_files)
    assert_one_line_error(result, 2, "not allowed with argument")
