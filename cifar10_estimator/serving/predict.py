"""Classify image files with an exported model, or a model file converted from one.

    python -m cifar10_estimator.serving.predict --export-dir JOB IMAGE [IMAGE ...]
    python -m cifar10_estimator.serving.predict --model FILE.tflite|FILE.onnx IMAGE [IMAGE ...]

Prints one line per image and class: path, class name and probability, separated by
tabs; with --top-k K each image gets K lines, most probable class first. Images may be
PNG, JPEG, GIF or BMP files of any size, decoded to RGB and resized to 32x32
(export.resize_to_cifar): by the export's image_bytes signature, or for --model by
TensorFlow before the file's runtime (runtimes.py) classifies the pixels. An image
that cannot be read or decoded gets one line on stderr, the others are still
answered, and the exit status is then 1.
"""

import argparse
import dataclasses
import sys
import typing

import numpy as np

from cifar10_estimator.cli.command import first_line, invoked_program, run_command
from cifar10_estimator.cli.options import option, options_parser, parse
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError
from cifar10_estimator.serving import options as shared

# The options naming the classifier; one of them is required.
CLASSIFIER = "classifier"


@dataclasses.dataclass(frozen=True)
class PredictOptions:
    """The command line: an export or a model file, and the images."""

    export_dir: typing.Optional[str] = shared.export_dir(exclusive=CLASSIFIER)
    model: typing.Optional[str] = shared.model(exclusive=CLASSIFIER)
    top_k: int = option(
        1, "Print the K most probable classes of each image, one line each, most probable "
           "first.", type=int, metavar="K")
    images: list = option(
        None, "Image files to classify.", positional=True, nargs="+", metavar="IMAGE")


def build_parser():
    return options_parser(
        PredictOptions,
        description="Classify PNG/JPEG images with a SavedModel exported by training, or "
                    "a .tflite or .onnx file converted from one. Prints "
                    "PATH<TAB>CLASS_NAME<TAB>PROBABILITY lines.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, required_exclusive=[CLASSIFIER])


def load_image_bytes_signature(export_dir):
    """The image_bytes signature of the SavedModel that export_dir designates.

    Returns:
      (export path, concrete function image_bytes: string [N] -> dict of outputs).

    Raises:
      Cifar10EstimatorError: no loadable export there, or one without the signature.
    """
    from cifar10_estimator.serving import runtimes
    path, model = runtimes.load_saved_model(export_dir)  # names a missing one before TF loads
    from cifar10_estimator.serving import export
    if export.IMAGE_BYTES_SIGNATURE not in model.signatures:
        raise Cifar10EstimatorError(
            "the SavedModel in %s has no %r signature; export it with "
            "cifar10_estimator.main" % (path, export.IMAGE_BYTES_SIGNATURE))
    return path, model.signatures[export.IMAGE_BYTES_SIGNATURE]


def image_bytes_classifier(export_dir):
    """classify(encoded image) -> probabilities [10], by the export's image_bytes signature."""
    _, signature = load_image_bytes_signature(export_dir)
    import tensorflow as tf  # lazy: keeps predict's --help and flag errors fast
    return lambda encoded: signature(image_bytes=tf.constant([encoded]))[
        "probabilities"].numpy()[0]


def model_file_classifier(path):
    """classify(encoded image) -> probabilities [10], decoded and resized by TensorFlow as
    the image_bytes signature does, then classified by the runtime of `path`."""
    from cifar10_estimator.serving import runtimes
    model = runtimes.load(path)
    # export loads TensorFlow (for its image decoder): only once the file is there, so that
    # a missing one is named at once.
    from cifar10_estimator.serving import export
    return lambda encoded: model.predict(
        export.decode_and_resize(encoded).numpy()[np.newaxis])["probabilities"][0]


def top_classes(probabilities, k):
    """[(class name, probability)] of the k most probable classes, most probable first.

    Ties keep class order, so the first entry is the signature's argmax class.
    """
    order = np.argsort(-probabilities, kind="stable")[:k]
    return [(cifar10_facts.CLASS_NAMES[index], float(probabilities[index]))
            for index in order]


def read_image_file(path):
    """The bytes of the image file at `path`, once TensorFlow has shown it decodes them.

    Raises:
      Cifar10EstimatorError: the file cannot be read or is not an image TensorFlow decodes.
    """
    import tensorflow as tf  # lazy: keeps predict's --help and flag errors fast
    if not tf.io.gfile.exists(path):
        raise Cifar10EstimatorError("%s: no such file" % path)
    try:
        with tf.io.gfile.GFile(path, "rb") as stream:
            encoded = stream.read()
    except (OSError, tf.errors.OpError) as error:
        raise Cifar10EstimatorError("%s: cannot read it (%s)" % (path, first_line(error)))
    try:
        # Decoded here first, as the classifier will, so that only a bad image is blamed
        # on the image (the signature's errors come as multi-line graph traces).
        tf.io.decode_image(encoded, channels=cifar10_facts.DEPTH, expand_animations=False)
    except tf.errors.InvalidArgumentError:
        raise Cifar10EstimatorError(
            "%s: cannot decode it: not a PNG, JPEG, GIF or BMP image, or damaged" % path)
    return encoded


def main(argv):
    args = parse(build_parser(), PredictOptions, argv)
    if not 1 <= args.top_k <= cifar10_facts.NUM_CLASSES:
        raise UsageError("--top-k must be between 1 and %d, got %d"
                         % (cifar10_facts.NUM_CLASSES, args.top_k))
    # One C++ warning per undecodable image would drown the output.
    quiet_tensorflow_logs("2", "ERROR")

    if args.model:
        classify = model_file_classifier(args.model)
    else:
        classify = image_bytes_classifier(args.export_dir)
    num_failed = 0
    for path in args.images:
        try:
            probabilities = classify(read_image_file(path))
        except Cifar10EstimatorError as error:
            print("%s: error: %s" % (invoked_program(), error), file=sys.stderr)
            num_failed += 1
            continue
        for name, probability in top_classes(probabilities, args.top_k):
            print("%s\t%s\t%.6f" % (path, name, probability))
        sys.stdout.flush()
    return 1 if num_failed else 0


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
