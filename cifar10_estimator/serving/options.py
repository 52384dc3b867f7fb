"""The flags several commands share, each declared once (cli.option).

A command adds the ones it takes to its parser with cli.add_options(parser,
shared("job_dir", ...)), and says there whether it requires them. Imports no
TensorFlow, so that a command's flags are checked before it loads.
"""

import dataclasses
import typing

from cifar10_estimator.cli import option


@dataclasses.dataclass(frozen=True)
class SharedOptions:
    """The declarations of the shared flags; no command makes one of these."""

    job_dir: typing.Optional[str] = option(
        None, "Directory training wrote (checkpoints and hparams.json).")
    data_dir: typing.Optional[str] = option(
        None, "Directory with the TFRecords written by generate_tfrecords.")
    export_dir: typing.Optional[str] = option(
        None, "An export (JOB/export/best/<timestamp>), a directory of timestamped exports "
              "(its newest), or a job dir (the newest export under export/best, else "
              "export/latest).")
    model: typing.Optional[str] = option(
        None, "A .tflite or .onnx file written by cifar10_estimator.serving.convert, run by "
              "its own runtime (the TensorFlow Lite interpreter, ONNX Runtime); or an "
              "export, as --export-dir takes it, its serving_default run by TensorFlow.",
        metavar="FILE")


def shared(*names):
    """The SharedOptions fields called `names`, for cli.add_options."""
    fields = {field.name: field for field in dataclasses.fields(SharedOptions)}
    return [fields[name] for name in names]
