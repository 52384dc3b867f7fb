"""A job's export in each runtime: test accuracy, agreement, size, latency and throughput.

    python -m cifar10_estimator.benchmarks.runtimes --job-dir JOB --data-dir DATA \
        [--work-dir DIR] [--rounds 3] [--json PATH]

converts the job's export (the newest under export/best, see export_dirs.resolve_export_dir)
with serving.convert to float TensorFlow Lite, int8 TensorFlow Lite (calibrated on the
first images of the validation subset) and ONNX, then measures the SavedModel and each
file, each run by its own runtime (serving.runtimes):
  - accuracy on the test set (the eval subset), every image once in batches of 100, and
    the share of images whose top-1 class is the SavedModel's;
  - size: the file, or the files of the export directory;
  - latency: the median time of a call on one image, over --latency-images calls;
  - throughput: images/sec of --throughput-batches calls on 100 images each.
Timings run in --rounds rounds with the runtimes in alternating order (A B C D, D C B A,
...) after a few untimed calls each; a figure is the median over rounds, so load from
other processes falls on every runtime alike. Every runtime computes on --threads
threads, by default as many as the CPUs this process may use; on a machine that other
work keeps busy, fewer threads than CPUs measure the runtimes rather than the waits
for a busy CPU (multi-threaded int8 kernels suffer most). Prints the results as
Markdown, with the command, the CPU, the date and how busy the machine was.
"""

import dataclasses
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import typing

from cifar10_estimator.cli.command import invoked_program, run_command
from cifar10_estimator.cli.markdown import markdown_table
from cifar10_estimator.cli.options import option, options_parser, parse, positive_int
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.machine import alternating_rounds
from cifar10_estimator.serving import options as shared

BATCH_SIZE = 100
WARMUP_CALLS = 5
FORMATS = ("tflite", "tflite-int8", "onnx")
FILE_NAMES = {"tflite": "model.tflite", "tflite-int8": "model-int8.tflite",
              "onnx": "model.onnx"}


@dataclasses.dataclass
class RuntimeResult:
    """What was measured of one model in its runtime."""

    name: str
    format: str
    runtime: str
    path: str
    num_bytes: int
    accuracy: float
    num_agreeing: int
    num_examples: int
    latency_ms: list = dataclasses.field(default_factory=list)
    images_per_sec: list = dataclasses.field(default_factory=list)

    @property
    def median_latency_ms(self):
        return statistics.median(self.latency_ms)

    @property
    def median_images_per_sec(self):
        return statistics.median(self.images_per_sec)


@dataclasses.dataclass(frozen=True)
class RuntimesOptions:
    """The command line: the job and its data, where to convert, how much to time."""

    job_dir: str = option(
        None, "a job dir (its newest export under export/best, else export/latest), or an "
              "export", required=True)
    # The eval subset is the test set; validation images calibrate int8.
    data_dir: str = shared.data_dir(required=True)
    work_dir: typing.Optional[str] = option(
        None, "where the converted files are written and kept (default: a temporary "
              "directory, removed afterwards)", metavar="DIR")
    rounds: int = option(3, "timing rounds (default 3)", type=positive_int)
    latency_images: int = option(
        200, "timed calls on one image per runtime and round (default 200)",
        type=positive_int)
    throughput_batches: int = option(
        10, "timed calls on %d images per runtime and round (default 10)" % BATCH_SIZE,
        type=positive_int)
    threads: typing.Optional[int] = option(
        None, "threads of every runtime (default: one per CPU this process may use)",
        type=positive_int, metavar="N")
    calibration_images: typing.Optional[int] = option(
        None, "validation images that calibrate int8 (default: convert's)",
        type=positive_int, metavar="N")
    json: typing.Optional[str] = option(
        None, "also write the results as JSON here", metavar="PATH")


def build_parser():
    return options_parser(
        RuntimesOptions,
        description="Test accuracy, agreement with the SavedModel, size, latency and "
                    "throughput of a job's export as a SavedModel, float and int8 "
                    "TensorFlow Lite and ONNX files, each in its own runtime.")


def directory_bytes(path):
    """The total size of the files under directory `path`."""
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def convert_all(export_dir, data_dir, work_dir, num_calibration_images, say):
    """{format: Conversion} of the export to every one of FORMATS, written to work_dir."""
    from cifar10_estimator.serving import convert

    conversions = {}
    for name in FORMATS:
        say("converting to %s" % name)
        conversions[name] = convert.convert(
            export_dir, name, os.path.join(work_dir, FILE_NAMES[name]), data_dir,
            num_calibration_images or convert.DEFAULT_CALIBRATION_IMAGES)
        say(convert.format_conversion(conversions[name]))
    return conversions


def time_latency_ms(model, images, num_calls):
    """Median milliseconds of model.predict on one image, over num_calls images."""
    for index in range(WARMUP_CALLS):
        model.predict(images[index:index + 1])
    seconds = []
    for index in range(num_calls):
        image = images[index % len(images)][None]
        start = time.perf_counter()
        model.predict(image)
        seconds.append(time.perf_counter() - start)
    return 1000 * statistics.median(seconds)


def time_images_per_sec(model, images, num_batches):
    """Images/sec of model.predict on num_batches batches of BATCH_SIZE images."""
    import numpy as np

    # The first BATCH_SIZE images (cycled if there are fewer), in every call.
    batch = np.resize(images, (BATCH_SIZE,) + images.shape[1:])
    model.predict(batch)
    start = time.perf_counter()
    for _ in range(num_batches):
        model.predict(batch)
    return num_batches * BATCH_SIZE / (time.perf_counter() - start)


def test_accuracies(models, images, labels, say):
    """[RuntimeResult] of each (runner, name, size) of `models` on the test images; the
    first model is the reference of the agreement."""
    import numpy as np

    from cifar10_estimator.serving import runtimes

    results, reference = [], None
    for model, name, num_bytes in models:
        say("test accuracy of %s (%s)" % (name, model.runtime))
        classes = runtimes.predict_in_batches(model, images, BATCH_SIZE)["classes"]
        reference = classes if reference is None else reference
        results.append(RuntimeResult(
            name=name, format=model.format_name, runtime=model.runtime, path=model.path,
            num_bytes=num_bytes, accuracy=float(np.mean(classes == labels)),
            num_agreeing=int(np.sum(classes == reference)), num_examples=len(labels)))
    return results


def time_in_rounds(models, results, images, args, say):
    """Append each round's latency and throughput of models[i] to results[i]; the models
    take turns in alternating order (alternating_rounds)."""
    def timings(model):
        return lambda: (time_latency_ms(model, images, args.latency_images),
                        time_images_per_sec(model, images, args.throughput_batches))

    def report(round_index, index, measurement):
        latency_ms, images_per_sec = measurement
        results[index].latency_ms.append(latency_ms)
        results[index].images_per_sec.append(images_per_sec)
        say("round %d: %-11s %7.2f ms per image at batch 1, %7.0f images/sec at batch %d"
            % (round_index + 1, results[index].name, latency_ms, images_per_sec, BATCH_SIZE))

    alternating_rounds.measure(
        {index: timings(model) for index, (model, _, _) in enumerate(models)}, args.rounds,
        report=report)


def measure(job_dir, data_dir, work_dir, args, say=print):
    """Convert, then measure every model; returns (results [RuntimeResult], facts dict)."""
    import tensorflow as tf  # lazy: keeps the benchmark's --help and flag errors fast

    from cifar10_estimator import cifar10
    from cifar10_estimator.benchmarks import host
    from cifar10_estimator.data import tfrecord_format
    from cifar10_estimator.serving import runtimes

    num_threads = args.threads or runtimes.cpu_threads()
    if args.threads:
        # TensorFlow's thread pools are the process's, fixed before it first runs anything
        # (by default one thread per CPU).
        tf.config.threading.set_intra_op_parallelism_threads(num_threads)
        tf.config.threading.set_inter_op_parallelism_threads(num_threads)
    facts = {"machine": host.describe_machine(), "num_threads": num_threads,
             "load_average_start": host.load_average()}
    meter = host.BackgroundCpuMeter()
    saved_model = runtimes.SavedModelRunner(job_dir)
    conversions = convert_all(saved_model.path, data_dir, work_dir, args.calibration_images, say)
    tfrecord_format.check_tfrecords(data_dir, "eval")
    images, labels = cifar10.Cifar10DataSet(data_dir, "eval",
                                            use_distortion=False).read_all_examples()
    models = [(saved_model, "SavedModel", directory_bytes(saved_model.path))] + [
        (runtimes.load(conversion.path, num_threads), name, conversion.num_bytes)
        for name, conversion in conversions.items()]

    results = test_accuracies(models, images, labels, say)
    time_in_rounds(models, results, images, args, say)
    facts.update(export_dir=saved_model.path, data_dir=data_dir,
                 num_calibration_images=conversions["tflite-int8"].num_calibration_images,
                 load_average_end=host.load_average(),
                 background_cpu_share=meter.share())
    return results, facts


def _size(num_bytes):
    return "%.2f MB" % (num_bytes / 1e6)


def markdown(results, facts, command, args):
    """The results as Markdown: what ran where, then the table."""
    from cifar10_estimator.benchmarks import host
    from cifar10_estimator.serving import runtimes

    reference = results[0]
    share = facts["background_cpu_share"]
    lines = [
        "- Command: `%s`" % command,
        "- Export: %s; test set: the eval subset of %s, %d images; int8 calibrated on the "
        "first %d validation images" % (facts["export_dir"], facts["data_dir"],
                                         reference.num_examples,
                                         facts["num_calibration_images"]),
        "- Date: %s; CPU: %s, %d logical CPUs" % (
            facts["machine"]["date"], host.cpu_identity(facts["machine"]),
            facts["machine"]["logical_cpus"]),
        "- Timing: %s per runtime; median of %d rounds, runtimes in alternating order; "
        "latency: median of %d calls on one image; throughput: %d calls on %d images"
        % (runtimes.threads_text(facts["num_threads"]), args.rounds, args.latency_images, args.throughput_batches,
           BATCH_SIZE),
        "- Load average (1/5/15 min) at start %s, at end %s; other processes took %s of "
        "the CPU time" % (facts["load_average_start"], facts["load_average_end"],
                          "unknown" if share is None else "%.0f %%" % (100 * share)),
        "",
        markdown_table(
            ["Model", "Runtime", "Test accuracy", "vs SavedModel",
             "Top-1 agreement with the SavedModel", "Size", "Latency, batch 1",
             "Throughput, batch %d" % BATCH_SIZE],
            [[result.name, result.runtime, "%.2f %%" % (100 * result.accuracy),
              "%+.2f points" % (100 * (result.accuracy - reference.accuracy)),
              "%.2f %% (%d/%d)" % (100.0 * result.num_agreeing / result.num_examples,
                                   result.num_agreeing, result.num_examples),
              _size(result.num_bytes), "%.2f ms" % result.median_latency_ms,
              "%.0f images/s" % result.median_images_per_sec] for result in results]),
    ]
    return "\n".join(lines)


def main(argv):
    args = parse(build_parser(), RuntimesOptions, argv)
    quiet_tensorflow_logs("2", "ERROR")
    command = " ".join([invoked_program()] + [shlex.quote(arg) for arg in argv])
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="cifar10_runtimes_")
    os.makedirs(work_dir, exist_ok=True)
    try:
        results, facts = measure(args.job_dir, args.data_dir, work_dir, args)
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    print()
    print(markdown(results, facts, command, args))
    if args.json:
        from cifar10_estimator import files
        files.write_json(args.json, {
            "command": command, **facts,
            "results": [dict(dataclasses.asdict(result),
                             median_latency_ms=result.median_latency_ms,
                             median_images_per_sec=result.median_images_per_sec)
                        for result in results]})


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
