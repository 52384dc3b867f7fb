"""Convert an export to a TensorFlow Lite or ONNX file, checked in its own runtime.

    python -m cifar10_estimator.serving.convert --export-dir JOB --to tflite|tflite-int8|onnx \
        --output FILE [--data-dir DATA] [--calibration-images 500]

Only the export's serving_default signature is converted (uint8 images [N, 32, 32, 3] in;
classes, class_names and probabilities out, see export.py). Its image_bytes signature
decodes (DecodeImage) and resizes (ScaleAndTranslate) with ops that neither TensorFlow
Lite's builtins nor ONNX have: the TensorFlow Lite converter fails on it, and tf2onnx
(told --use_default to get past its images placeholder) exits 0 having written a file
that ONNX Runtime refuses to load.
  tflite       float32; the SavedModel's numbers up to rounding.
  tflite-int8  weights and activations quantized to int8 (full-integer quantization), their
               ranges calibrated on the first --calibration-images images of the
               validation subset of --data-dir, never on the test set that accuracy is
               measured on. The uint8 pixels in and the float32 probabilities out stay as
               they are, so the file replaces the others as it is.
  onnx         float32, through tf2onnx, for ONNX Runtime (pip install -e '.[onnx]').
The file is written under a temporary name, loaded in its runtime (runtimes.py) and run
on one batch beside the SavedModel, and only then renamed to --output: a float file
whose probabilities differ from the SavedModel's by more than FLOAT_TOLERANCE is not
written.
"""

import argparse
import dataclasses
import logging
import sys
import typing

import numpy as np

from cifar10_estimator import files
from cifar10_estimator.cli.command import first_line, run_command, stderr_dropped_on_success
from cifar10_estimator.cli.options import option, options_parser, parse, positive_int
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.data import cifar10_facts, tfrecord_format
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError
from cifar10_estimator.serving import export_dirs
from cifar10_estimator.serving import options as shared
from cifar10_estimator.serving import runtimes

CALIBRATION_SUBSET = "validation"
# Calibration records each activation's min and max over these images: a few hundred
# hold every class many times over, and the ranges they give quantize the test set
# about as well as thousands do (see docs/other-runtimes.md).
DEFAULT_CALIBRATION_IMAGES = 500
CALIBRATION_BATCH_SIZE = 50
CHECK_BATCH_SIZE = 100
# Largest difference of a float file's probabilities from the SavedModel's: float32
# kernels that add in another order differ by about 1e-6.
FLOAT_TOLERANCE = 1e-4
_CHECK_SEED = 0


@dataclasses.dataclass(frozen=True)
class Target:
    """What --to writes: its file suffix, what it holds, how it is made and how it runs."""

    name: str
    suffix: str
    description: str
    # function(SavedModel directory, calibration images) -> the file's bytes; the images
    # are those of --calibration-images for a calibrated target, else none.
    to_bytes: typing.Callable
    runner: type
    # None: quantized, its outputs are not expected to equal the SavedModel's.
    tolerance: float = None
    calibrated: bool = False
    # Raises Cifar10EstimatorError, before any work, when what it needs is not installed.
    check_installed: typing.Callable = lambda: None


@dataclasses.dataclass(frozen=True)
class Check:
    """One batch run by the written file's runtime and by the SavedModel."""

    images: str
    num_images: int
    num_agreeing: int
    max_probability_difference: float
    runtime: str


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A file written by `convert`."""

    path: str
    target: Target
    export_dir: str
    num_bytes: int
    num_calibration_images: int
    check: Check


def _tflite_converter(export_dir):
    import tensorflow as tf  # lazy: keeps convert's --help and flag errors fast
    from cifar10_estimator.serving import export
    return tf.lite.TFLiteConverter.from_saved_model(
        export_dir, signature_keys=[export.SERVING_SIGNATURE])


def tflite_float(export_dir):
    """The serving_default signature of the SavedModel in export_dir as float32 .tflite bytes."""
    return _tflite_converter(export_dir).convert()


def tflite_int8(export_dir, calibration_images):
    """The serving_default signature as .tflite bytes with int8 weights and activations.

    Args:
      export_dir: a SavedModel directory.
      calibration_images: uint8 [N, 32, 32, 3]; each activation is quantized over the
        range it takes on them.
    """
    import tensorflow as tf  # lazy: keeps convert's --help and flag errors fast
    converter = _tflite_converter(export_dir)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: (
        {runtimes.IMAGES_KEY: calibration_images[start:start + CALIBRATION_BATCH_SIZE]}
        for start in range(0, len(calibration_images), CALIBRATION_BATCH_SIZE))
    # Int8 kernels only; the uint8 input and float32 outputs keep their types, converted
    # at the edges (inference_input_type and inference_output_type stay float).
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return converter.convert()


def _import_tf2onnx():
    try:
        import tf2onnx
    except ImportError as error:
        raise Cifar10EstimatorError(
            "--to onnx needs tf2onnx (%s); install it with: %s"
            % (first_line(error), runtimes.ONNX_INSTALL_HINT))
    # It logs each step of the conversion at INFO and WARNING.
    logging.getLogger(tf2onnx.constants.TF2ONNX_PACKAGE_NAME).setLevel(logging.ERROR)
    return tf2onnx


def _check_onnx_installed():
    """Raises Cifar10EstimatorError unless tf2onnx and ONNX Runtime are installed: --to onnx
    needs both, and neither comes with TensorFlow."""
    _import_tf2onnx()
    runtimes.import_onnxruntime()


def onnx_model(export_dir):
    """The serving_default signature of the SavedModel in export_dir as .onnx bytes."""
    _import_tf2onnx()
    from tf2onnx import convert as tf2onnx_convert
    from tf2onnx import tf_loader
    from cifar10_estimator.serving import export
    graph_def, inputs, outputs, tensors_to_rename = tf_loader.from_saved_model(
        export_dir, None, None, tag="serve", signatures=[export.SERVING_SIGNATURE],
        return_tensors_to_rename=True)
    model_proto, _ = tf2onnx_convert.from_graph_def(
        graph_def, name=export_dir, input_names=inputs, output_names=outputs,
        tensors_to_rename=tensors_to_rename)
    return model_proto.SerializeToString()


TARGETS = {target.name: target for target in (
    Target("tflite", runtimes.TFLITE_SUFFIX, "TensorFlow Lite, float32",
           lambda export_dir, _: tflite_float(export_dir), runtimes.TFLiteRunner,
           tolerance=FLOAT_TOLERANCE),
    Target("tflite-int8", runtimes.TFLITE_SUFFIX,
           "TensorFlow Lite, int8 weights and activations", tflite_int8,
           runtimes.TFLiteRunner, calibrated=True),
    Target("onnx", runtimes.ONNX_SUFFIX, "ONNX, float32",
           lambda export_dir, _: onnx_model(export_dir), runtimes.OnnxRunner,
           tolerance=FLOAT_TOLERANCE, check_installed=_check_onnx_installed),
)}


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """The command line: the export, the target and its file, the data that checks it."""

    export_dir: str = shared.export_dir(required=True)
    to: str = option(
        None, "tflite: float32; tflite-int8: int8 weights and activations, calibrated on "
              "validation images (needs --data-dir); onnx: float32 (needs pip install -e "
              "'.[onnx]').",
        required=True, choices=list(TARGETS))
    output: str = option(
        None, "The file to write, ending in .tflite or .onnx as --to.",
        required=True, metavar="FILE")
    # The first images of its validation subset calibrate tflite-int8 and check every
    # file (without it, float files are checked on random images).
    data_dir: typing.Optional[str] = shared.data_dir()
    calibration_images: int = option(
        DEFAULT_CALIBRATION_IMAGES, "Validation images that calibrate tflite-int8 (all of "
                                    "them if the subset holds fewer).",
        type=positive_int, metavar="N")


def build_parser():
    return options_parser(
        ConvertOptions,
        description="Convert the serving_default signature of a SavedModel exported by "
                    "training to a TensorFlow Lite (float or int8) or ONNX file, and check "
                    "it in its runtime against the SavedModel.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)


def check_args(target, output, data_dir):
    """Raises UsageError for an --output of another kind, or int8 without --data-dir."""
    if not output.lower().endswith(target.suffix):
        raise UsageError("--output of --to %s must end in %s, got %s"
                         % (target.name, target.suffix, output))
    if target.calibrated and data_dir is None:
        raise UsageError("--to %s calibrates on the %s images of --data-dir: pass --data-dir "
                         "DIR (TFRecords written by generate_tfrecords)"
                         % (target.name, CALIBRATION_SUBSET))


def validation_images(data_dir, count):
    """The first `count` images of the validation subset (all if it holds fewer).

    Raises:
      Cifar10EstimatorError: data_dir has no validation TFRecords, they are damaged (see
        tfrecord_format.check_tfrecords), or they hold no image.
    """
    from cifar10_estimator import cifar10
    dataset = cifar10.Cifar10DataSet(data_dir, CALIBRATION_SUBSET, use_distortion=False)
    tfrecord_format.check_tfrecords(data_dir, CALIBRATION_SUBSET)
    images, _ = dataset.read_all_examples()
    if not len(images):
        raise Cifar10EstimatorError("the %s subset of %s holds no images to calibrate or "
                                    "check on" % (CALIBRATION_SUBSET, data_dir))
    return images[:count]


def random_images(count, seed=_CHECK_SEED):
    """uint8 [count, 32, 32, 3] of uniformly random pixels."""
    return np.random.RandomState(seed).randint(
        0, 256, [count, cifar10_facts.HEIGHT, cifar10_facts.WIDTH, cifar10_facts.DEPTH]
    ).astype(np.uint8)


def check_model(model, saved_model, images, images_description, tolerance):
    """Run one batch through `model` and the SavedModel; compare.

    Raises:
      Cifar10EstimatorError: tolerance is not None and a probability differs by more.
    """
    outputs = model.predict(images)
    expected = saved_model.predict(images)
    if outputs["probabilities"].shape != expected["probabilities"].shape:
        raise Cifar10EstimatorError(
            "%s gives probabilities of shape %s, the SavedModel %s"
            % (model.path, outputs["probabilities"].shape, expected["probabilities"].shape))
    difference = float(np.max(np.abs(outputs["probabilities"] - expected["probabilities"])))
    if tolerance is not None and not difference <= tolerance:
        raise Cifar10EstimatorError(
            "the converted model's probabilities differ from the SavedModel's by %.3g (more "
            "than %g) on %s" % (difference, tolerance, images_description))
    return Check(images=images_description, num_images=len(images),
                 num_agreeing=int(np.sum(outputs["classes"] == expected["classes"])),
                 max_probability_difference=difference, runtime=model.runtime)


def write_checked(content, output, target, saved_model, images, images_description):
    """Write `content` to `output` once its runtime has loaded and checked it.

    Written under a temporary name beside `output` and renamed (files.written_whole):
    `output` is either the old file or the whole checked new one, never part of one.

    Returns:
      the Check.

    Raises:
      Cifar10EstimatorError: the file cannot be written, or fails its check.
    """
    try:
        with files.written_whole(output) as temporary:
            with open(temporary, "wb") as stream:
                stream.write(content)
            check = check_model(target.runner(temporary), saved_model, images,
                                images_description, target.tolerance)
    except OSError as error:
        raise Cifar10EstimatorError("cannot write %s (%s)" % (output, error.strerror or error))
    return check


def convert(export_dir, to, output, data_dir=None,
            num_calibration_images=DEFAULT_CALIBRATION_IMAGES):
    """Convert the export that export_dir designates and write it, checked, to `output`.

    Args:
      export_dir: as export_dirs.resolve_export_dir takes it.
      to: a name of TARGETS.
      output: the file to write, ending in TARGETS[to].suffix.
      data_dir: TFRecords whose validation images calibrate (int8, then required) and
        check the file; None checks on random images.
      num_calibration_images: how many validation images calibrate an int8 file.

    Returns:
      the Conversion.

    Raises:
      UsageError, Cifar10EstimatorError: bad arguments, no export, no data, no converter
        installed, or a file that fails its check.
    """
    target = TARGETS[to]
    check_args(target, output, data_dir)
    target.check_installed()
    saved_model = runtimes.SavedModelRunner(export_dir)
    if data_dir is None:
        images, description = random_images(CHECK_BATCH_SIZE), "random images"
    else:
        images = validation_images(data_dir, max(num_calibration_images, CHECK_BATCH_SIZE))
        description = "%d %s images" % (min(len(images), CHECK_BATCH_SIZE), CALIBRATION_SUBSET)
    calibration_images = images[:num_calibration_images] if target.calibrated else images[:0]
    # The converters print pages of summaries from C++; only a failure's are of use.
    with stderr_dropped_on_success():
        content = target.to_bytes(saved_model.path, calibration_images)
    check = write_checked(content, output, target, saved_model, images[:CHECK_BATCH_SIZE],
                          description)
    return Conversion(path=output, target=target, export_dir=saved_model.path,
                      num_bytes=len(content), num_calibration_images=len(calibration_images),
                      check=check)


def format_conversion(conversion):
    """What `convert` did, as lines for a terminal."""
    check = conversion.check
    lines = ["wrote %s: %s, %d bytes, from %s" % (
        conversion.path, conversion.target.description, conversion.num_bytes,
        conversion.export_dir)]
    if conversion.num_calibration_images:
        lines.append("calibrated on %d %s images" % (conversion.num_calibration_images,
                                                     CALIBRATION_SUBSET))
    lines.append("checked in %s on %s: top-1 agrees with the SavedModel on %d of %d, "
                 "probabilities differ by at most %.2g" % (
                     check.runtime, check.images, check.num_agreeing, check.num_images,
                     check.max_probability_difference))
    return "\n".join(lines)


def main(argv):
    args = parse(build_parser(), ConvertOptions, argv)
    check_args(TARGETS[args.to], args.output, args.data_dir)  # before TensorFlow loads
    # Also before: a missing export or missing data is named in a moment.
    export_dirs.resolve_export_dir(args.export_dir)
    if args.data_dir is not None:
        tfrecord_format.check_tfrecords_exist(args.data_dir, [CALIBRATION_SUBSET])
    quiet_tensorflow_logs("2", "ERROR")
    conversion = convert(args.export_dir, args.to, args.output, args.data_dir,
                         args.calibration_images)
    print(format_conversion(conversion))


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
