"""Using a trained model: SavedModel export and finding an export.

Training exports SavedModels through the EvalSpec's exporters, after evaluations:

    job-dir/export/latest/<timestamp>/   the newest LATEST_EXPORTS_TO_KEEP exports
    job-dir/export/best/<timestamp>/     the model of the most accurate evaluation so far
                                         (the earliest of equals), across restarts

An export is written into a temp-<timestamp>/ directory beside them and renamed when
complete; the exporters here delete what a killed or failed export left there, and
export_dirs.resolve_export_dir only ever picks a complete, timestamped export.

Each export has two signatures over one copy of the network:
  serving_default              images: uint8 [N, 32, 32, 3], raw RGB pixels in NHWC;
  image_bytes:serving_default  image_bytes: string [N], encoded PNG/JPEG/GIF/BMP files of
                               any size, decoded to RGB and resized as `resize_to_cifar`.
Both return classes (int64 [N]), class_names (string [N]) and probabilities
(float32 [N, 10]); see model_fn._predictions.
"""

import os
import time

import tensorflow as tf

from cifar10_estimator import cifar10
from cifar10_estimator.serving.export_dirs import (
    BEST_EXPORTER_NAME, LATEST_EXPORTER_NAME, SAVED_MODEL_FILENAME, timestamped_exports)
LATEST_EXPORTS_TO_KEEP = 3
BEST_EXPORTS_TO_KEEP = 1

# tf.estimator's name of an export being written (export_lib.get_temp_export_dir).
_UNFINISHED_EXPORT_PREFIX = "temp-"

IMAGES_KEY = "images"
IMAGE_BYTES_KEY = "image_bytes"
SERVING_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
# The Estimator names the signature of a receiver alternative "<alternative>:<output key>".
IMAGE_BYTES_SIGNATURE = "%s:%s" % (IMAGE_BYTES_KEY, SERVING_SIGNATURE)

_IMAGE_SHAPE = [cifar10.HEIGHT, cifar10.WIDTH, cifar10.DEPTH]


def resize_to_cifar(image):
    """Resize one RGB image [height, width, 3] of any size to uint8 [32, 32, 3].

    Bilinear with antialiasing (a proper low-pass filter when shrinking, smooth when
    enlarging), ignoring the aspect ratio, then rounded to whole pixel values like
    the CIFAR images the model was trained on.
    """
    resized = tf.image.resize(
        image, [cifar10.HEIGHT, cifar10.WIDTH], method="bilinear",
        antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)


def decode_and_resize(encoded_image):
    """Decode one PNG, JPEG, GIF (first frame) or BMP string to uint8 RGB [32, 32, 3]."""
    image = tf.io.decode_image(encoded_image, channels=cifar10.DEPTH,
                               expand_animations=False)
    return resize_to_cifar(image)


def serving_input_receiver_fn():
    """The ServingInputReceiver of both signatures: raw images, or encoded image files."""
    image_bytes = tf.compat.v1.placeholder(tf.string, [None], name=IMAGE_BYTES_KEY)
    decoded = tf.map_fn(cifar10.without_autograph(decode_and_resize), image_bytes,
                        fn_output_signature=tf.TensorSpec(_IMAGE_SHAPE, tf.uint8))
    # Feeding `images` cuts the graph above it, so serving_default never touches the
    # decoder, and image_bytes reaches the same network through the default value.
    images = tf.compat.v1.placeholder_with_default(
        decoded, [None] + _IMAGE_SHAPE, name=IMAGES_KEY)
    return tf.estimator.export.ServingInputReceiver(
        features={IMAGES_KEY: images},
        receiver_tensors={IMAGES_KEY: images},
        receiver_tensors_alternatives={IMAGE_BYTES_KEY: {IMAGE_BYTES_KEY: image_bytes}})


class NewestExport:
    """The SavedModel the latest exporter wrote last and the checkpoint it holds.

    The best exporter runs after it on the same evaluation and, when it exports, would
    build the same graph from the same checkpoint again (a model_fn call, a restore and
    a write: about a third of a small run's evaluation); it copies this one instead.
    """

    def __init__(self):
        self.checkpoint_path = None
        self.export_dir = None

    def of(self, checkpoint_path):
        """The export of checkpoint_path if it is this one and still complete, else None."""
        if (checkpoint_path == self.checkpoint_path and self.export_dir and
                tf.io.gfile.exists(os.path.join(self.export_dir, SAVED_MODEL_FILENAME))):
            return self.export_dir
        return None


class BestAccuracyExporter(tf.estimator.Exporter):
    """Exports when the eval accuracy is higher than that of every earlier evaluation.

    tf.estimator.BestExporter with an accuracy compare_fn does the same within one
    process, but always exports on its first evaluation after a restart: with one
    export kept, a resumed job would replace a better best export by a worse one.
    This exporter compares with the evaluations recorded in the eval dir instead.
    """

    def __init__(self, name, serving_input_receiver_fn, exports_to_keep, eval_name,
                 newest_export=None):
        """eval_name: the named evaluation whose accuracies are compared (its eval dir).
        newest_export: a NewestExport; an export of the checkpoint it holds is copied."""
        self._eval_name = eval_name
        self._exports_to_keep = exports_to_keep
        self._newest_export = newest_export
        # LatestExporter does the writing and the garbage collection; this class decides when.
        self._exporter = tf.estimator.LatestExporter(
            name, serving_input_receiver_fn, exports_to_keep=exports_to_keep)

    @property
    def name(self):
        return self._exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        if timestamped_exports(export_path):
            best = best_accuracy_before(estimator.eval_dir(self._eval_name),
                                        eval_result["global_step"])
            if best is not None and eval_result["accuracy"] <= best:
                return None
        source = self._newest_export and self._newest_export.of(checkpoint_path)
        if source:
            return copy_export(source, export_path, self._exports_to_keep)
        return self._exporter.export(
            estimator, export_path, checkpoint_path, eval_result, is_the_final_export)


def copy_export(source_dir, export_path, exports_to_keep):
    """Copy the SavedModel source_dir to a new export_path/<timestamp>/, as tf.estimator
    writes one (into temp-<timestamp>/, renamed when complete), and keep the newest
    exports_to_keep exports there. Returns the new export's path (bytes)."""
    timestamp = int(time.time())
    while tf.io.gfile.exists(os.path.join(export_path, str(timestamp))):
        timestamp += 1
    final_dir = os.path.join(export_path, str(timestamp))
    temp_dir = os.path.join(export_path, _UNFINISHED_EXPORT_PREFIX + str(timestamp))
    for directory, _, file_names in tf.io.gfile.walk(source_dir):
        target = os.path.join(temp_dir, os.path.relpath(directory, source_dir))
        tf.io.gfile.makedirs(target)
        for file_name in file_names:
            tf.io.gfile.copy(os.path.join(directory, file_name), os.path.join(target, file_name))
    tf.io.gfile.rename(temp_dir, final_dir)
    for old_export in timestamped_exports(export_path)[:-exports_to_keep]:
        tf.io.gfile.rmtree(old_export)
    return final_dir.encode()


def best_accuracy_before(eval_dir, global_step):
    """The highest accuracy of the evaluations in eval_dir before global_step, or None."""
    accuracies = []
    for path in tf.io.gfile.glob(os.path.join(eval_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            if event.step < global_step:
                accuracies += [value.simple_value for value in event.summary.value
                               if value.tag == "accuracy"]
    return max(accuracies, default=None)


class CompleteExportsExporter(tf.estimator.Exporter):
    """Runs an exporter and leaves only complete exports in its directory.

    tf.estimator writes each export into export_path/temp-<timestamp>/ and renames it
    to <timestamp>/ when complete: an export killed or failed on the way leaves that
    directory behind, which also blocks a later export of the same second. This process
    is the job dir's only exporter (the trainer holds the job dir; a cluster has one
    evaluator), so any such directory is left over: it goes before each export and
    after one that failed.
    """

    def __init__(self, exporter, newest_export=None):
        """newest_export: a NewestExport to record each export in, or None."""
        self._exporter = exporter
        self._newest_export = newest_export

    @property
    def name(self):
        return self._exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        remove_unfinished_exports(export_path)
        try:
            export_dir = self._exporter.export(
                estimator, export_path, checkpoint_path, eval_result, is_the_final_export)
        except BaseException:
            remove_unfinished_exports(export_path)
            raise
        if self._newest_export is not None and export_dir:
            self._newest_export.checkpoint_path = checkpoint_path
            self._newest_export.export_dir = tf.compat.as_str(export_dir)
        return export_dir


def remove_unfinished_exports(export_path):
    """Delete the temp-<timestamp> directories of exports in export_path that never finished."""
    if not tf.io.gfile.isdir(export_path):
        return
    for name in tf.io.gfile.listdir(export_path):
        if name.startswith(_UNFINISHED_EXPORT_PREFIX):
            tf.io.gfile.rmtree(os.path.join(export_path, name.rstrip("/")))


def latest_exporter(newest_export=None):
    """The exporter of export/latest: a SavedModel after every evaluation, recorded in
    newest_export (a NewestExport) if given."""
    return CompleteExportsExporter(tf.estimator.LatestExporter(
        LATEST_EXPORTER_NAME, serving_input_receiver_fn, exports_to_keep=LATEST_EXPORTS_TO_KEEP),
        newest_export)


def best_exporter(eval_name, newest_export=None):
    """The exporter of export/best, comparing the accuracies of the evaluation `eval_name`;
    it copies the export newest_export holds when that is of the same checkpoint."""
    return CompleteExportsExporter(BestAccuracyExporter(
        BEST_EXPORTER_NAME, serving_input_receiver_fn,
        exports_to_keep=BEST_EXPORTS_TO_KEEP, eval_name=eval_name, newest_export=newest_export))


def latest_and_best_exporters(eval_name):
    """export/latest's exporter, then export/best's, which copies what the first wrote."""
    newest_export = NewestExport()
    return [latest_exporter(newest_export), best_exporter(eval_name, newest_export)]
