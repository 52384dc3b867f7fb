"""Evaluate a checkpoint or a model file on every example of a subset: accuracy, per
class, confusion matrix.

    python -m cifar10_estimator.serving.evaluate --job-dir JOB --data-dir DATA [--subset validation]
    python -m cifar10_estimator.serving.evaluate --model FILE --data-dir DATA [--subset validation]

With --job-dir the network is rebuilt from job-dir/hparams.json (its newest run's, written
by training) and restored from the newest checkpoint of the job dir that reads (one line
names the newer ones that do not), or --checkpoint. Predictions
are those of the exported model (argmax over the 10 real classes, see
model_fn._predictions): with the weights' moving averages if training kept them
(--moving-average-decay), and averaged over each image's mirror and shifted views if
it evaluated so (--eval-flips, --eval-shifts).
With --model the predictions are those of a .tflite or .onnx file written by
convert.py, run by its own runtime (the TensorFlow Lite interpreter, ONNX Runtime), or
of an export's serving_default signature run by TensorFlow (runtimes.py).
"""

import argparse
import dataclasses
import sys
import typing

import numpy as np

from cifar10_estimator import files
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.cli.command import first_line, invoked_program, run_command
from cifar10_estimator.cli.options import option, options_parser, parse, positive_int
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.data import cifar10_facts, tfrecord_format
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError
from cifar10_estimator.machine import gpu_devices
from cifar10_estimator.serving import options as shared

# The options naming what is evaluated; one of them is required.
EVALUATED = "evaluated"


@dataclasses.dataclass(frozen=True)
class EvaluateOptions:
    """The command line: a checkpoint (--job-dir) or a model file, and the data."""

    job_dir: typing.Optional[str] = shared.job_dir(exclusive=EVALUATED)
    model: typing.Optional[str] = shared.model(exclusive=EVALUATED)
    data_dir: str = shared.data_dir(required=True)
    subset: str = option("eval", "Which examples to evaluate.", choices=["eval", "validation"])
    checkpoint: typing.Optional[str] = option(
        None, "Checkpoint prefix such as JOB/model.ckpt-80000, or a directory (its latest "
              "checkpoint); default the latest in --job-dir. Only with --job-dir.",
        metavar="PATH")
    json: typing.Optional[str] = option(
        None, "Also write the results as JSON here.", metavar="PATH")
    batch_size: int = option(
        100, "Examples per batch; need not divide the subset.", type=positive_int)


def build_parser():
    return options_parser(
        EvaluateOptions,
        description="Evaluate a trained checkpoint, or a model file in its runtime, on every "
                    "example of a subset once: overall and per-class accuracy and the "
                    "confusion matrix.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, required_exclusive=[EVALUATED])


def resolve_checkpoint(job_dir, checkpoint=None):
    """The checkpoint prefix to evaluate: `checkpoint`, or the newest in job_dir that reads.

    Where newer ones do not read (run.damaged_checkpoints), one line on stderr names
    them and the one evaluated instead; the job dir is left as it is.

    Args:
      job_dir: the training job dir.
      checkpoint: None, a checkpoint prefix (PATH.index exists) or a directory of
        checkpoints (its newest that reads is taken).

    Raises:
      Cifar10EstimatorError: there is no such checkpoint, or it (every one) cannot be read.
    """
    import tensorflow as tf  # lazy: keeps evaluate's --help and flag errors fast
    from cifar10_estimator.run import damaged_checkpoints
    if checkpoint is None or tf.io.gfile.isdir(checkpoint):
        directory = job_dir if checkpoint is None else checkpoint
        newest = damaged_checkpoints.newest_readable(directory)
        if newest.checkpoint is None:
            raise Cifar10EstimatorError(
                "no checkpoint in %s; train first, or pass --checkpoint PATH" % directory
                if checkpoint is None else "no checkpoint in directory %s" % directory)
        if newest.unreadable:
            print("%s: warning: %s: evaluating %s, the newest that reads" % (
                invoked_program(), newest.unreadable_text(), newest.checkpoint),
                file=sys.stderr, flush=True)
        return newest.checkpoint
    if not tf.io.gfile.exists(checkpoint + ".index"):
        raise Cifar10EstimatorError(
            "checkpoint %s not found (no %s.index); pass a prefix such as "
            "JOB/model.ckpt-1000 or a directory of checkpoints" % (checkpoint, checkpoint))
    reason = damaged_checkpoints.unreadable_reason(checkpoint)
    if reason:
        raise Cifar10EstimatorError("checkpoint %s cannot be read (%s)" % (checkpoint, reason))
    return checkpoint


def predict_subset(checkpoint, hparams, data_dir, subset, batch_size, evaluation_graph=False):
    """Predicted and true classes of every example of `subset`, once each, in file order.

    Args:
      checkpoint: checkpoint prefix to restore.
      hparams: job_hparams.HParams the checkpoint was trained with.
      data_dir, subset: the TFRecords to read.
      batch_size: examples per session run; need not divide the subset.
      evaluation_graph: False: the exports' graph (float32); True: the trainer's
        evaluation graph, which computes in the training precision with
        --eval-in-training-precision (benchmarks.evaluation compares the two).

    Returns:
      (predicted, labels): two int64 numpy arrays [num_examples].

    Raises:
      Cifar10EstimatorError: missing or damaged data (see tfrecord_format.check_tfrecords),
        or a checkpoint that does not fit the model.
    """
    import tensorflow as tf  # lazy: keeps evaluate's --help and flag errors fast
    from cifar10_estimator import cifar10, model_fn

    dataset = cifar10.Cifar10DataSet(data_dir, subset, use_distortion=False)
    # A file cut short would otherwise be read round again to fill the count.
    tfrecord_format.check_tfrecords(data_dir, subset)
    num_examples = dataset.num_examples_per_epoch()
    batch_size = min(batch_size, num_examples)
    num_batches = -(-num_examples // batch_size)
    with tf.Graph().as_default():
        # The data set's batches are always full and run on into the next epoch in
        # the same file order, so the last batch wraps around: keep the first
        # num_examples predictions and every example counts exactly once.
        images, labels = dataset.make_batch(batch_size)
        # The CPU's towers and layout, whatever devices the job trained on.
        make = model_fn.make_model_fn(model_fn.TowerLayout.for_devices(num_gpus=0), hparams)
        if evaluation_graph:
            spec = make([images], [labels], tf.estimator.ModeKeys.EVAL, None)
        else:
            # PREDICT runs one channels_last tower wherever TensorFlow places it (model_fn).
            spec = make({"images": images}, None, tf.estimator.ModeKeys.PREDICT, None)
        # The Saver of both restores what exports hold: the averaged weights, if any.
        saver = spec.scaffold.saver or tf.compat.v1.train.Saver()
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
        # At most the first GPU, its memory taken as it grows: not every GPU's memory,
        # which a training on the same machine may be using.
        gpu_devices.take_gpus(config, 1)
        with tf.compat.v1.Session(config=config) as session:
            try:
                saver.restore(session, checkpoint)
            except (tf.errors.OpError, ValueError) as error:
                raise Cifar10EstimatorError(
                    "cannot restore %s into a ResNet-%d (%s); is it a checkpoint of this "
                    "job dir?" % (checkpoint, hparams.num_layers, first_line(error)))
            batches = [session.run([spec.predictions["classes"], labels])
                       for _ in range(num_batches)]
    predicted = np.concatenate([classes for classes, _ in batches])[:num_examples]
    true = np.concatenate([batch_labels for _, batch_labels in batches])[:num_examples]
    return predicted.astype(np.int64), true.astype(np.int64)


def predict_subset_with_model(model, data_dir, subset, batch_size):
    """Predicted and true classes of every example of `subset` by a runtimes.load model.

    Returns:
      (predicted, labels): two int64 numpy arrays [num_examples], in file order.

    Raises:
      Cifar10EstimatorError: missing or damaged data (see tfrecord_format.check_tfrecords).
    """
    from cifar10_estimator import cifar10
    from cifar10_estimator.serving import runtimes
    dataset = cifar10.Cifar10DataSet(data_dir, subset, use_distortion=False)
    tfrecord_format.check_tfrecords(data_dir, subset)
    images, labels = dataset.read_all_examples()
    predicted = runtimes.predict_in_batches(model, images, batch_size)["classes"]
    return predicted.astype(np.int64), labels


def confusion_matrix(labels, predicted):
    """int64 [10, 10]: entry [t, p] counts examples of true class t predicted as p."""
    num_classes = cifar10_facts.NUM_CLASSES
    pairs = np.asarray(labels, np.int64) * num_classes + np.asarray(predicted, np.int64)
    return np.bincount(pairs, minlength=num_classes * num_classes).reshape(
        num_classes, num_classes)


def summarize(matrix):
    """Accuracies of a confusion matrix, as a JSON-ready dict.

    Returns:
      dict with num_examples, num_correct, accuracy, per_class (class name ->
      {num_examples, num_correct, accuracy}, accuracy None for a class without
      examples), class_names and confusion_matrix (rows true, columns predicted).
    """
    correct = np.diag(matrix)
    totals = matrix.sum(axis=1)
    per_class = {
        name: {"num_examples": int(total), "num_correct": int(hits),
               "accuracy": float(hits) / total if total else None}
        for name, hits, total in zip(cifar10_facts.CLASS_NAMES, correct, totals)}
    num_examples = int(matrix.sum())
    return {
        "num_examples": num_examples,
        "num_correct": int(correct.sum()),
        "accuracy": float(correct.sum()) / num_examples if num_examples else None,
        "per_class": per_class,
        "class_names": list(cifar10_facts.CLASS_NAMES),
        "confusion_matrix": matrix.tolist(),
    }


def _fraction(accuracy, hits, total):
    if accuracy is None:
        return "   n/a (0/0)"
    return "%.4f (%d/%d)" % (accuracy, hits, total)


def format_report(results, what_lines):
    """The results of `summarize` (plus the subset) as text for a terminal.

    Args:
      results: dict of summarize, with subset.
      what_lines: lines that say what was evaluated, printed first.
    """
    width = max(len(name) for name in cifar10_facts.CLASS_NAMES) + 1
    lines = list(what_lines) + [
        "subset: %s, %d examples" % (results["subset"], results["num_examples"]),
        "accuracy: %s" % _fraction(results["accuracy"], results["num_correct"],
                                   results["num_examples"]),
        "",
        "per-class accuracy:",
    ]
    for name in cifar10_facts.CLASS_NAMES:
        entry = results["per_class"][name]
        lines.append("  %-*s %s" % (width, name, _fraction(
            entry["accuracy"], entry["num_correct"], entry["num_examples"])))
    lines += ["", "confusion matrix (rows: true class, columns: predicted class):",
              " " * width + "".join("%*s" % (width, name)
                                    for name in cifar10_facts.CLASS_NAMES)]
    for name, row in zip(cifar10_facts.CLASS_NAMES, results["confusion_matrix"]):
        lines.append("%-*s" % (width, name) + "".join("%*d" % (width, count) for count in row))
    return "\n".join(lines)


def _global_step(checkpoint):
    import tensorflow as tf  # lazy: keeps evaluate's --help and flag errors fast
    reader = tf.train.load_checkpoint(checkpoint)
    if not reader.has_tensor("global_step"):
        return None
    return int(reader.get_tensor("global_step"))


def evaluate_checkpoint(args):
    """(results of the checkpoint that args designate, lines saying what it is)."""
    hparams = job_hparams.load(args.job_dir)
    checkpoint = resolve_checkpoint(args.job_dir, args.checkpoint)
    from cifar10_estimator.training import weight_averaging  # loads TensorFlow
    predicted, labels = predict_subset(
        checkpoint, hparams, args.data_dir, args.subset, args.batch_size)
    results = summarize(confusion_matrix(labels, predicted))
    results.update(checkpoint=checkpoint, global_step=_global_step(checkpoint),
                   weights=weight_averaging.evaluated_weights(hparams.moving_average_decay,
                                                              checkpoint))
    return results, ["checkpoint: %s (global step %s)" % (checkpoint, results["global_step"]),
                     "weights: %s" % results["weights"]]


def evaluate_model(args):
    """(results of the model file or export args.model, lines saying what it is)."""
    from cifar10_estimator.serving import runtimes
    model = runtimes.load(args.model)
    predicted, labels = predict_subset_with_model(model, args.data_dir, args.subset,
                                                  args.batch_size)
    results = summarize(confusion_matrix(labels, predicted))
    results.update(model=model.path, format=model.format_name, runtime=model.runtime)
    return results, ["model: %s (%s)" % (model.path, model.format_name),
                     "runtime: %s" % model.runtime]


def main(argv):
    args = parse(build_parser(), EvaluateOptions, argv)
    if args.model and args.checkpoint:
        raise UsageError("--checkpoint is for --job-dir; a --model holds its own weights")
    quiet_tensorflow_logs("2", "ERROR")
    # Before anything loads TensorFlow, so that missing data is named in a moment.
    tfrecord_format.check_tfrecords_exist(args.data_dir, [args.subset])
    results, what_lines = evaluate_model(args) if args.model else evaluate_checkpoint(args)
    results.update(subset=args.subset, data_dir=args.data_dir)
    print(format_report(results, what_lines))
    if args.json:
        files.write_json(args.json, results)


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
