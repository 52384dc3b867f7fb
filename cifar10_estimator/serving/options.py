"""The options several commands share, each declared once (cli.options.option).

A command's options class declares the ones it takes as fields, saying there whether it
requires them: `job_dir: str = shared.job_dir(required=True)`. Imports no TensorFlow, so
that a command's flags are checked before it loads.
"""

from cifar10_estimator.cli.options import option


def job_dir(**keywords):
    """--job-dir: a training job's directory; keywords as cli.options.option takes them."""
    return option(None, "Directory training wrote (checkpoints and hparams.json).", **keywords)


def data_dir(**keywords):
    """--data-dir: TFRecords."""
    return option(None, "Directory with the TFRecords written by generate_tfrecords.",
                  **keywords)


def export_dir(**keywords):
    """--export-dir: an export, as export_dirs.resolve_export_dir takes it."""
    return option(
        None, "An export (JOB/export/best/<timestamp>), a directory of timestamped exports "
              "(its newest), or a job dir (the newest export under export/best, else "
              "export/latest).", **keywords)


def model(**keywords):
    """--model: a file convert wrote, or an export."""
    return option(
        None, "A .tflite or .onnx file written by cifar10_estimator.serving.convert, run by "
              "its own runtime (the TensorFlow Lite interpreter, ONNX Runtime); or an "
              "export, as --export-dir takes it, its serving_default run by TensorFlow.",
        metavar="FILE", **keywords)
