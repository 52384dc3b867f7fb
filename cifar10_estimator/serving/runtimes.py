"""Running a trained model in TensorFlow, the TensorFlow Lite interpreter or ONNX Runtime.

    model = runtimes.load(path)          # an export, a .tflite or an .onnx file
    outputs = model.predict(images)      # uint8 [N, 32, 32, 3] raw RGB pixels in NHWC
    outputs["classes"], outputs["probabilities"]     # int64 [N], float32 [N, 10]

Every kind runs the export's serving_default signature (export.py), or the file that
convert.py made of it, whose input and outputs are the same. Each runtime computes on
every CPU this process may use (`cpu_threads`) unless told otherwise: the files' runtimes
per model (num_threads), TensorFlow for the whole process (tf.config.threading, set
before TensorFlow first runs anything).
"""

import os

import numpy as np

from cifar10_estimator.cli.command import first_line
from cifar10_estimator.errors import Cifar10EstimatorError

TFLITE_SUFFIX = ".tflite"
ONNX_SUFFIX = ".onnx"
ONNX_INSTALL_HINT = "pip install -e '.[onnx]'"

IMAGES_KEY = "images"
OUTPUT_KEYS = ("classes", "probabilities")


def cpu_threads():
    """The number of CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_text(num_threads):
    """'1 thread', '2 threads', ...: how a runtime computes, for reports."""
    return "%d thread%s" % (num_threads, "" if num_threads == 1 else "s")


def import_onnxruntime():
    """The onnxruntime module.

    Raises:
      Cifar10EstimatorError: it is not installed (naming the extra that installs it).
    """
    try:
        import onnxruntime
    except ImportError as error:
        raise Cifar10EstimatorError(
            "ONNX needs onnxruntime (%s); install it with: %s"
            % (first_line(error), ONNX_INSTALL_HINT))
    return onnxruntime


def load_saved_model(export_dir):
    """(path, loaded SavedModel) of the export that export_dir designates (export_dirs).

    Raises:
      Cifar10EstimatorError: no loadable export there.
    """
    from cifar10_estimator.serving import export_dirs
    path = export_dirs.resolve_export_dir(export_dir)  # a missing one named before TF loads
    import tensorflow as tf  # lazy: keeps convert's --help and flag errors fast
    try:
        return path, tf.saved_model.load(path)
    except (OSError, ValueError, tf.errors.OpError) as error:
        raise Cifar10EstimatorError("cannot load the SavedModel in %s (%s)"
                                    % (path, first_line(error)))


class SavedModelRunner:
    """An export's serving_default signature, run by TensorFlow."""

    format_name = "SavedModel"

    def __init__(self, export_dir):
        import tensorflow as tf  # lazy: keeps convert's --help and flag errors fast
        from cifar10_estimator.serving import export
        self.path, model = load_saved_model(export_dir)
        if export.SERVING_SIGNATURE not in model.signatures:
            raise Cifar10EstimatorError(
                "the SavedModel in %s has no %r signature; export it with "
                "cifar10_estimator.main" % (self.path, export.SERVING_SIGNATURE))
        self._model = model  # the signature needs its SavedModel alive
        self._signature = model.signatures[export.SERVING_SIGNATURE]
        self.runtime = "TensorFlow %s, %s" % (tf.__version__, threads_text(
            tf.config.threading.get_intra_op_parallelism_threads() or cpu_threads()))

    def predict(self, images):
        import tensorflow as tf  # lazy: keeps convert's --help and flag errors fast
        outputs = self._signature(**{IMAGES_KEY: tf.constant(images, tf.uint8)})
        return {key: outputs[key].numpy() for key in OUTPUT_KEYS}


class TFLiteRunner:
    """A .tflite file's serving_default signature, run by the TensorFlow Lite interpreter."""

    format_name = "TensorFlow Lite"

    def __init__(self, path, num_threads=None):
        import tensorflow as tf  # lazy: keeps convert's --help and flag errors fast
        from cifar10_estimator.serving import export
        self.path = path
        num_threads = num_threads or cpu_threads()
        try:
            interpreter = tf.lite.Interpreter(model_path=path, num_threads=num_threads)
            self._runner = interpreter.get_signature_runner(export.SERVING_SIGNATURE)
        except (ValueError, RuntimeError) as error:
            raise Cifar10EstimatorError(
                "cannot load %s in the TensorFlow Lite interpreter (%s); write it with "
                "cifar10_estimator.serving.convert" % (path, first_line(error)))
        _check_signature(path, self._runner.get_input_details(),
                         self._runner.get_output_details())
        self.runtime = "TensorFlow Lite interpreter %s, %s" % (tf.__version__,
                                                               threads_text(num_threads))

    def predict(self, images):
        outputs = self._runner(**{IMAGES_KEY: np.asarray(images, np.uint8)})
        return {key: outputs[key] for key in OUTPUT_KEYS}


class OnnxRunner:
    """An .onnx file, run by ONNX Runtime on the CPU."""

    format_name = "ONNX"

    def __init__(self, path, num_threads=None):
        onnxruntime = import_onnxruntime()
        from onnxruntime.capi import onnxruntime_pybind11_state as errors
        self.path = path
        num_threads = num_threads or cpu_threads()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        try:
            self._session = onnxruntime.InferenceSession(
                path, options, providers=["CPUExecutionProvider"])
        except (errors.Fail, errors.InvalidArgument, errors.InvalidGraph, errors.InvalidProtobuf,
                errors.NotImplemented) as error:
            raise Cifar10EstimatorError(
                "cannot load %s in ONNX Runtime (%s); write it with "
                "cifar10_estimator.serving.convert" % (path, first_line(error)))
        _check_signature(path, {item.name: item for item in self._session.get_inputs()},
                         {item.name: item for item in self._session.get_outputs()})
        self.runtime = "ONNX Runtime %s, %s" % (onnxruntime.__version__,
                                                threads_text(num_threads))

    def predict(self, images):
        outputs = self._session.run(list(OUTPUT_KEYS),
                                    {IMAGES_KEY: np.asarray(images, np.uint8)})
        return dict(zip(OUTPUT_KEYS, outputs))


FILE_RUNNERS = {TFLITE_SUFFIX: TFLiteRunner, ONNX_SUFFIX: OnnxRunner}


def _check_signature(path, inputs, outputs):
    """Raises Cifar10EstimatorError unless the model takes images and gives OUTPUT_KEYS."""
    missing = [key for key in (IMAGES_KEY,) if key not in inputs] + [
        key for key in OUTPUT_KEYS if key not in outputs]
    if missing:
        raise Cifar10EstimatorError(
            "%s is not a model of serving_default (no %s); convert an export with "
            "cifar10_estimator.serving.convert" % (path, ", ".join(missing)))


def load(path, num_threads=None):
    """The runner of `path`: a .tflite or .onnx file, else an export (as
    export_dirs.resolve_export_dir takes it).

    Args:
      path: the file, or the export as export_dirs.resolve_export_dir takes it.
      num_threads: threads of a file's runtime; None: cpu_threads().

    Raises:
      Cifar10EstimatorError: nothing loadable there, or its runtime is not installed.
    """
    suffix = os.path.splitext(path)[1].lower()
    if suffix in FILE_RUNNERS:
        if not os.path.isfile(path):
            raise Cifar10EstimatorError(
                "model file %s does not exist; write it with "
                "cifar10_estimator.serving.convert" % path)
        return FILE_RUNNERS[suffix](path, num_threads)
    if os.path.isfile(path):
        raise Cifar10EstimatorError(
            "%s is neither a %s nor an %s file, nor an export directory"
            % (path, TFLITE_SUFFIX, ONNX_SUFFIX))
    return SavedModelRunner(path)


def predict_in_batches(model, images, batch_size):
    """model.predict over `images` in batches of batch_size (the last may be smaller).

    Returns:
      dict of OUTPUT_KEYS -> numpy arrays over all images, in order.
    """
    batches = [model.predict(images[start:start + batch_size])
               for start in range(0, len(images), batch_size)]
    return {key: np.concatenate([batch[key] for batch in batches]) for key in OUTPUT_KEYS}
