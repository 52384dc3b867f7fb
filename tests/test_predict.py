"""The predict command: image files in, PATH<TAB>CLASS<TAB>PROBABILITY lines out."""

import os

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


@pytest.fixture
def image_files(tmp_path):
    """A PNG and a JPEG, neither 32x32."""
    png = tmp_path / "wide.png"
    jpeg = tmp_path / "small photo.jpg"
    write_image(png, 45, 70, tf.io.encode_png, seed=1)
    write_image(jpeg, 20, 24, lambda pixels: tf.io.encode_jpeg(pixels, quality=90), seed=2)
    return [png, jpeg]


def expected_ranking(export_dir, path, trained_job):
    """[(class name, probability)], most probable first, of serving_default on the file
    decoded as TensorFlow decodes it and resized as the export documents."""
    image = tf.io.decode_image(path.read_bytes(), channels=3, expand_animations=False)
    resized = export.resize_to_cifar(image).numpy()[np.newaxis]
    probabilities = trained_job.serve_images(export_dir, resized)["probabilities"][0]
    order = np.argsort(-probabilities, kind="stable")
    return [(cifar10.CLASS_NAMES[index], probabilities[index]) for index in order]


def parse_lines(stdout):
    rows = [line.split("\t") for line in stdout.splitlines()]
    assert all(len(row) == 3 for row in rows), stdout
    return [(path, name, float(probability)) for path, name, probability in rows]


@slow
def test_prints_the_top_class_of_png_and_jpeg_files_of_any_size(trained_job, image_files):
    result = run_module(MODULE, ["--export-dir", trained_job.job_dir] + image_files)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = parse_lines(result.stdout)
    assert [path for path, _, _ in rows] == [str(path) for path in image_files]
    # Given a job dir, predict uses the newest export under export/best.
    export_dir = trained_job.exports("best")[-1]
    for (_, name, probability), path in zip(rows, image_files):
        expected_name, expected_probability = expected_ranking(export_dir, path, trained_job)[0]
        assert name == expected_name
        assert probability == pytest.approx(expected_probability, abs=2e-6)


@slow
def test_top_k_prints_k_lines_per_image_most_probable_first(trained_job, image_files):
    latest = trained_job.exports("latest")
    # A directory of timestamped exports: predict uses the newest.
    result = run_module(MODULE, ["--export-dir", os.path.dirname(latest[-1]), "--top-k", "3"]
                        + image_files)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = parse_lines(result.stdout)
    assert len(rows) == 3 * len(image_files)
    for index, path in enumerate(image_files):
        image_rows = rows[3 * index:3 * index + 3]
        assert {row[0] for row in image_rows} == {str(path)}
        expected = expected_ranking(latest[-1], path, trained_job)[:3]
        assert [name for _, name, _ in image_rows] == [name for name, _ in expected]
        np.testing.assert_allclose([p for _, _, p in image_rows], [p for _, p in expected],
                                   atol=2e-6)


@slow
def test_unreadable_images_are_reported_and_the_others_still_answered(
        trained_job, image_files, tmp_path):
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("not an image\n")
    missing = tmp_path / "missing.jpg"
    args = [image_files[0], not_an_image, missing, image_files[1]]
    result = run_module(MODULE, ["--export-dir", trained_job.exports("best")[-1]] + args)

    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert [path for path, _, _ in parse_lines(result.stdout)] == [
        str(image_files[0]), str(image_files[1])]
    errors = [line for line in result.stderr.splitlines()
              if line.startswith("python -m %s: error:" % MODULE)]
    assert len(errors) == 2, result.stderr[-3000:]
    assert str(not_an_image) in errors[0] and "cannot decode" in errors[0]
    assert str(missing) in errors[1] and "no such file" in errors[1]


@slow
def test_an_export_dir_without_exports_is_a_one_line_error(tmp_path, image_files):
    result = run_module(MODULE, ["--export-dir", tmp_path] + image_files)
    assert_one_line_error(result, 1, "no SavedModel in %s" % tmp_path)


def test_top_k_beyond_the_ten_classes_is_a_usage_error(tmp_path, image_files):
    result = run_module(MODULE, ["--export-dir", tmp_path, "--top-k", "11"] + image_files)
    assert_one_line_error(result, 2, "--top-k must be between 1 and 10")


@slow
@pytest.mark.parametrize("to", ["tflite", "onnx"])
def test_a_float_model_file_ranks_as_the_export_does(trained_job, converted_models, to,
                                                     image_files):
    result = run_module(MODULE, ["--model", converted_models[to].path, "--top-k", "3"]
                        + image_files)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = parse_lines(result.stdout)
    assert len(rows) == 3 * len(image_files)
    export_dir = trained_job.exports("best")[-1]
    for index, path in enumerate(image_files):
        image_rows = rows[3 * index:3 * index + 3]
        assert {row[0] for row in image_rows} == {str(path)}
        expected = expected_ranking(export_dir, path, trained_job)[:3]
        assert [name for _, name, _ in image_rows] == [name for name, _ in expected]
        np.testing.assert_allclose([p for _, _, p in image_rows], [p for _, p in expected],
                                   atol=2e-6)


@slow
def test_an_int8_model_file_answers_with_a_probability_per_image(converted_models,
                                                                 image_files):
    result = run_module(MODULE, ["--model", converted_models["tflite-int8"].path]
                        + image_files)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = parse_lines(result.stdout)
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
