"""Benchmarks: throughput measured on this machine, against its ceiling and the alternatives.

    python -m cifar10_estimator.benchmarks [--smoke | --quick | --full] [--output-dir DIR]

writes DIR/benchmark.json and DIR/benchmark.md (the machine, the command, every
measurement and the ratios against their targets):
  1. input pipeline: Cifar10DataSet against the original tutorial's (input_benchmark);
  2. training examples/sec of the real trainer on TFRecords against --use-synthetic-data,
     the ceiling (benchmark_training);
  3. the same ResNet, data and optimisation in Keras model.fit (benchmark_keras);
  4. 2 logical CPU towers against 1 at the same global batch, and TensorFlow's pooling
     CPU allocator (TF_CPU_ALLOCATOR_USE_BFC=true) against its default, which the trainer
     and Keras use;
  5. generate_tfrecords against the original conversion, on a 60000-image archive in
     the official format (benchmark_conversion);
  6. FLOPs per example counted from the graph (benchmark_flops) x examples/sec, as a
     fraction of the FP32 peak derived from the CPU (machine.cpu_peak), or of its bf16
     peak for bf16 runs, and the peak resident memory of every run;
  7. --precision bf16 against fp32, for the trainer and for Keras (mixed_bfloat16), where
     the CPU has bfloat16 instructions; fp16 only runs on GPUs, which this CPU benchmark
     does not use.
Every comparison runs in one invocation with its sides alternated (A B, B A, ...); the
reported figure is the median over rounds. --smoke (under a minute, tiny model and data)
checks the machinery only; --quick (minutes) measures ResNet-20; --full measures ResNet-20
and ResNet-44 with more steps and rounds (tens of minutes); --num-layers picks the depths.
--sections measures only some sections and --runs only some training runs (to measure one
comparison again): the report then holds those, and the ratios whose both sides ran.
"""

import dataclasses
import os
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
import typing

from cifar10_estimator import files
from cifar10_estimator import hparams as job_hparams
from cifar10_estimator.cli.command import invoked_program, run_command
from cifar10_estimator.cli.options import option, option_per_value, options_parser, parse
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError

JSON_FILENAME = "benchmark.json"
MARKDOWN_FILENAME = "benchmark.md"
# Each official batch file holds 10000 images: 40000 train, 10000 validation, 10000 eval.
OFFICIAL_IMAGES_PER_BATCH = 10000

# The sections, in the order they run; the machine is always described.
SECTIONS = ("conversion", "input_pipeline", "flops", "training")
# The input pipeline and training read the converted TFRecords; without the conversion
# section they are converted once, untimed.
SECTIONS_READING_TFRECORDS = ("input_pipeline", "training")

_POOLING_ALLOCATOR = (("TF_CPU_ALLOCATOR_USE_BFC", "true"),)
BF16_FLAGS = ("--precision", "bf16")
# The runs compared at each depth: (name, kind, TrainingRun's other fields). Real data, the
# ceiling, Keras, two towers, TensorFlow's pooling (BFC) CPU allocator, which a user can opt
# into, and where the CPU has bfloat16 the trainer and Keras in bf16. Every run uses
# TensorFlow's default CPU allocator unless its name says pooling_allocator.
TRAINING_RUNS = (
    ("estimator_tfrecords", "estimator", {}),
    ("estimator_synthetic", "estimator", {"data": "synthetic"}),
    ("keras_fit", "keras", {}),
    ("estimator_synthetic_2_towers", "estimator", {"data": "synthetic", "num_cpu_towers": 2}),
    ("estimator_tfrecords_pooling_allocator", "estimator", {"extra_env": _POOLING_ALLOCATOR}),
    ("estimator_tfrecords_bf16", "estimator", {"extra_flags": BF16_FLAGS}),
    ("keras_fit_bf16", "keras", {"extra_flags": BF16_FLAGS}),
    ("estimator_tfrecords_bf16_pooling_allocator", "estimator",
     {"extra_flags": BF16_FLAGS, "extra_env": _POOLING_ALLOCATOR}),
)
RUN_NAMES = tuple(name for name, _, _ in TRAINING_RUNS)

TARGETS = {
    "real_data_vs_synthetic": 0.97,
    "estimator_vs_keras": 1.0,
    "estimator_vs_keras_bf16": 1.0,
    "bf16_vs_fp32": 1.6,
    "two_towers_vs_one": 0.90,
    "conversion_vs_original": 1.0,
}


@dataclasses.dataclass(frozen=True)
class Mode:
    """How much to measure: sizes, step counts and rounds."""

    name: str
    images_per_archive_batch: int
    conversion_rounds: int
    input_batches: int
    input_warmup_batches: int
    input_rounds: int
    depths: tuple
    batch_size: int
    warmup_steps: int
    timed_steps: int
    training_rounds: int
    # The final evaluation is not timed; a small eval file keeps it short.
    num_eval_examples: int


MODES = {
    # The least that still runs every part: the first throughput line comes at step 10, so
    # 10 warm-up steps; 20 timed steps make two turns, in order then reversed; one eval
    # batch. Batch 8 (4 a tower in the two-tower run) keeps the steps cheap: the runs'
    # start-up is what costs, and smoke figures are not measurements.
    "smoke": Mode("smoke", images_per_archive_batch=200, conversion_rounds=1,
                  input_batches=5, input_warmup_batches=2, input_rounds=1, depths=(8,),
                  batch_size=8, warmup_steps=10, timed_steps=20, training_rounds=1,
                  num_eval_examples=100),
    "quick": Mode("quick", images_per_archive_batch=OFFICIAL_IMAGES_PER_BATCH,
                  conversion_rounds=2, input_batches=100, input_warmup_batches=20,
                  input_rounds=2, depths=(20,), batch_size=128, warmup_steps=10,
                  timed_steps=50, training_rounds=1, num_eval_examples=1000),
    "full": Mode("full", images_per_archive_batch=OFFICIAL_IMAGES_PER_BATCH,
                 conversion_rounds=3, input_batches=200, input_warmup_batches=20,
                 input_rounds=4, depths=(20, 44), batch_size=128, warmup_steps=20,
                 timed_steps=100, training_rounds=2, num_eval_examples=1000),
}


@dataclasses.dataclass(frozen=True)
class SuiteOptions:
    """The command line: how much to measure, and where the results and scratch files go."""

    mode: str = option_per_value("quick", {
        "smoke": "check the machinery in under a minute (ResNet-8, tiny data)",
        "quick": "ResNet-20, full-size data, a few minutes (default)",
        "full": "ResNet-20 and ResNet-44, more steps and rounds, tens of minutes"})
    num_layers: typing.Optional[list] = option(
        None, "ResNet depths to train (6n+2) instead of the mode's",
        type=job_hparams.resnet_depth, nargs="+", metavar="N")
    output_dir: str = option(
        "benchmark_results", "where benchmark.json and benchmark.md are written (default: "
                             "%(default)s)", metavar="DIR")
    work_dir: typing.Optional[str] = option(
        None, "scratch space for the archive, TFRecords and jobs, about 1 GB (default: a "
              "temporary directory, removed afterwards)", metavar="DIR")
    sections: list = option(
        list(SECTIONS), "measure only these sections: %s (default: all); training also "
                        "counts the FLOPs its GFLOP/s come from" % ", ".join(SECTIONS),
        choices=SECTIONS, nargs="+", metavar="SECTION")
    runs: typing.Optional[list] = option(
        None, "train only these runs (default: all); a ratio is reported where both of its "
              "runs trained: %s" % ", ".join(RUN_NAMES), choices=RUN_NAMES, nargs="+",
        metavar="RUN")


def build_parser():
    return options_parser(
        SuiteOptions,
        description="Measure input, training and conversion throughput on this "
                    "machine and write benchmark.json and benchmark.md.")


def main(argv):
    args = parse(build_parser(), SuiteOptions, argv)
    if args.runs and "training" not in args.sections:
        raise UsageError("--runs picks training runs: add training to --sections")
    # `kill` must not leave paused trainers and the work directory behind: SIGTERM
    # unwinds like Ctrl-C, through the clean-up below and in training.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # Graph building for the FLOPs count logs notices that are not the benchmark's.
    quiet_tensorflow_logs("1", "ERROR")
    mode = MODES[args.mode]
    if args.num_layers:
        mode = dataclasses.replace(mode, depths=tuple(args.num_layers))
    command = " ".join([invoked_program()] + [shlex.quote(arg) for arg in argv])
    os.makedirs(args.output_dir, exist_ok=True)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="cifar10_benchmark_")
    os.makedirs(work_dir, exist_ok=True)
    try:
        results = run_benchmarks(mode, work_dir, command, args.sections, args.runs or RUN_NAMES)
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    from cifar10_estimator.benchmarks import suite_report

    json_path = os.path.join(args.output_dir, JSON_FILENAME)
    markdown_path = os.path.join(args.output_dir, MARKDOWN_FILENAME)
    files.write_json(json_path, results)
    with files.written_whole(markdown_path) as temporary, open(temporary, "w") as stream:
        stream.write(suite_report.markdown(results))
    print(suite_report.summary(results))
    print("wrote %s and %s" % (json_path, markdown_path))


def _say(text):
    print(text, flush=True)


def _percent(share):
    return "unknown" if share is None else "%.0f %%" % (100 * share)


def run_benchmarks(mode, work_dir, command, sections=SECTIONS, run_names=RUN_NAMES):
    """Run `sections` of `mode` (training: its runs named in run_names) in work_dir; returns
    the results as a JSON-ready dict."""
    from cifar10_estimator.benchmarks import host

    # Training's GFLOP/s and Keras's parameter check need the FLOPs counts.
    sections = [name for name in SECTIONS if name in sections
                or (name == "flops" and "training" in sections)]
    started, meter = time.time(), host.BackgroundCpuMeter()
    results = {"command": command, "mode": mode.name, "settings": dataclasses.asdict(mode),
               "sections": sections, "load_average_start": host.load_average(),
               "machine": host.describe_machine(), "precisions": precisions_measured()}
    _say("measuring on %s" % host.cpu_identity(results["machine"]))
    for name, note in results["precisions"].items():
        _say("--precision %s: %s" % (name, note))
    if list(SECTIONS) != sections:
        _say("measuring only: %s" % ", ".join(sections))
    if tuple(run_names) != RUN_NAMES:
        _say("training only: %s" % ", ".join(run_names))
    data_dir = os.path.join(work_dir, "data")
    if "conversion" in sections:
        results["conversion"] = conversion_section(mode, work_dir, data_dir)
    elif set(SECTIONS_READING_TFRECORDS) & set(sections):
        convert_untimed(mode, data_dir)
    training_data_dir = os.path.join(work_dir, "training_data")
    if set(SECTIONS_READING_TFRECORDS) & set(sections):
        prepare_training_data(data_dir, training_data_dir, mode.num_eval_examples)
    if "input_pipeline" in sections:
        results["input_pipeline"] = input_pipeline_section(mode, training_data_dir)
    if "flops" in sections:
        results["flops"] = flops_section(mode)
    if "training" in sections:
        results["training"] = training_section(mode, training_data_dir, work_dir,
                                               results["precisions"]["bf16"] == "measured",
                                               run_names)
    results["comparisons"] = comparisons(results)
    results["load_average_end"] = host.load_average()
    results["background_cpu_share"] = meter.share()
    results["duration_secs"] = time.time() - started
    return results


def _write_archive(mode, archive_dir):
    """Write the official-format archive of `mode` in archive_dir; returns (path, images)."""
    from cifar10_estimator.benchmarks import conversion
    from cifar10_estimator.data import cifar10_archive

    archive = os.path.join(archive_dir, cifar10_archive.ARCHIVE_FILENAME)
    os.makedirs(archive_dir, exist_ok=True)
    num_images = 6 * mode.images_per_archive_batch
    _say("writing an official-format archive of %d random images" % num_images)
    conversion.write_official_format_archive(archive, mode.images_per_archive_batch)
    return archive, num_images


def convert_untimed(mode, data_dir):
    """The TFRecords the other sections read, when the conversion section does not run."""
    from cifar10_estimator.benchmarks import conversion

    archive, _ = _write_archive(mode, data_dir)
    conversion.convert_with_the_package(archive, data_dir)
    os.remove(archive)


def conversion_section(mode, work_dir, data_dir):
    """Section 5: the package's converter against the original way, on one archive."""
    from cifar10_estimator.benchmarks import conversion

    archive, num_images = _write_archive(mode, os.path.join(work_dir, "archive"))

    def report(round_index, way, measurement):
        _say("conversion round %d: %-8s %6.2f s  %8.0f images/sec"
             % (round_index + 1, way, measurement.seconds, measurement.images_per_sec(num_images)))

    measurements, same_examples = conversion.compare_conversions(
        archive, os.path.join(work_dir, "conversions"), mode.conversion_rounds,
        keep_package_output=data_dir, report=report)
    section = {"num_images": num_images, "archive_bytes": os.path.getsize(archive),
               "same_examples_both_ways": same_examples}
    os.remove(archive)
    for way, runs in measurements.items():
        section[way] = {"seconds": [run.seconds for run in runs],
                        "cpu_seconds": [run.cpu_seconds for run in runs],
                        "median_images_per_sec": statistics.median(
                            run.images_per_sec(num_images) for run in runs)}
    return section


def prepare_training_data(converted_dir, training_data_dir, num_eval_examples):
    """The converted train file, and the first num_eval_examples of the eval set.

    Training is timed without the final evaluation, but every run does one; a small eval
    file keeps it from dominating the wall time.
    """
    from cifar10_estimator.data import tfrecord_format
    from cifar10_estimator.data import cifar10_archive

    os.makedirs(training_data_dir)
    train_path = tfrecord_format.tfrecord_path(training_data_dir, "train")
    os.link(tfrecord_format.tfrecord_path(converted_dir, "train"), train_path)
    images, labels = cifar10_archive.load_batch(os.path.join(
        cifar10_archive.batches_dir(converted_dir), cifar10_archive.SUBSET_BATCHES["eval"][0]))
    num_eval = tfrecord_format.write_tfrecords(
        tfrecord_format.tfrecord_path(training_data_dir, "eval"),
        images[:num_eval_examples], labels[:num_eval_examples])
    tfrecord_format.write_metadata(training_data_dir, {
        "train": tfrecord_format.num_examples("train", converted_dir), "eval": num_eval})


def input_pipeline_section(mode, data_dir):
    """Section 1: Cifar10DataSet against the original tutorial's pipeline (input_benchmark)."""
    from cifar10_estimator.benchmarks import input_pipeline

    def report(round_index, original, dataset):
        _say("input round %d: original %.0f examples/sec, Cifar10DataSet %.0f examples/sec"
             % (round_index + 1, original.examples_per_sec, dataset.examples_per_sec))

    comparison = input_pipeline.compare_input_pipelines(
        data_dir, mode.batch_size, mode.input_batches, mode.input_rounds,
        mode.input_warmup_batches, report)
    return {
        "batch_size": mode.batch_size,
        "original_examples_per_sec": [m.examples_per_sec for m in comparison.original],
        "dataset_examples_per_sec": [m.examples_per_sec for m in comparison.dataset],
        "original_cpu_ms_per_batch": input_pipeline.mean_cpu_ms_per_batch(comparison.original),
        "dataset_cpu_ms_per_batch": input_pipeline.mean_cpu_ms_per_batch(comparison.dataset),
    }


def flops_section(mode):
    """Section 6 (counts): FLOPs per example of each measured depth."""
    from cifar10_estimator.benchmarks import flops

    counts = {}
    for depth in mode.depths:
        counts[str(depth)] = flops.count_model_flops(depth, mode.batch_size)
        _say("ResNet-%d: %.1f MFLOPs/example forward, %.1f MFLOPs/example per training step, "
             "%d trainable parameters"
             % (depth, counts[str(depth)]["forward_flops_per_example"] / 1e6,
                counts[str(depth)]["train_step_flops_per_example"] / 1e6,
                counts[str(depth)]["trainable_parameters"]))
    return counts


def precisions_measured():
    """{precision: 'measured' or why not} for the precisions beyond fp32."""
    from cifar10_estimator.machine import hardware
    from cifar10_estimator.settings import precision

    cpu_flags, onednn_enabled = hardware.cpu_flags(), hardware.onednn_enabled()
    bf16_reason = precision.unsupported_reason(
        precision.policy("bf16"), 0, cpu_flags, onednn_enabled)
    return {"bf16": "not measured: " + bf16_reason if bf16_reason else "measured",
            "fp16": "not measured: " + precision.unsupported_reason(
                precision.policy("fp16"), 0, cpu_flags, onednn_enabled)}


def training_runs(depth, batch_size, with_bf16, names=RUN_NAMES):
    """The runs of TRAINING_RUNS named in `names` at one depth; bf16 runs only with_bf16."""
    from cifar10_estimator.benchmarks.training import TrainingRun

    return [TrainingRun(name, kind, depth, batch_size, **fields)
            for name, kind, fields in TRAINING_RUNS
            if name in names and (with_bf16 or BF16_FLAGS not in fields.values())]


def training_section(mode, data_dir, work_dir, with_bf16, run_names=RUN_NAMES):
    """Sections 2-4 and 6 (memory): the runs of each depth interleaved, once per round."""
    from cifar10_estimator.benchmarks import training

    jobs_dir = os.path.join(work_dir, "jobs")
    os.makedirs(jobs_dir, exist_ok=True)
    section = {"warmup_steps": mode.warmup_steps, "timed_steps": mode.timed_steps,
               "rounds": mode.training_rounds, "batch_size": mode.batch_size,
               "steps_per_turn": training.LOG_EVERY_N_STEPS, "runs": []}
    for depth in mode.depths:
        runs = training_runs(depth, mode.batch_size, with_bf16, run_names)
        if not runs:
            raise Cifar10EstimatorError(
                "none of the runs of --runs can train here: the bf16 runs need a CPU with "
                "bfloat16 instructions (see the --precision bf16 line above)")
        rounds = []
        for round_index in range(mode.training_rounds):
            rounds.append(training.measure_interleaved(
                runs, data_dir, jobs_dir, mode.warmup_steps, mode.timed_steps,
                _turn_reporter(round_index)))
        for run in runs:
            measured = [measurements[run.name] for measurements in rounds]
            entry = dataclasses.asdict(run)
            entry.update({
                "description": run.description(),
                "examples_per_sec": [m.examples_per_sec for m in measured],
                "median_examples_per_sec": statistics.median(m.examples_per_sec
                                                             for m in measured),
                "interval_examples_per_sec": [m.interval_examples_per_sec for m in measured],
                "background_cpu_shares": [m.background_cpu_shares for m in measured],
                "mean_background_cpu_share": _mean([m.mean_background_cpu_share
                                                    for m in measured]),
                "process_cpu_secs": [m.cpu_secs for m in measured],
                "max_rss_mb": max((m.max_rss_mb for m in measured if m.max_rss_mb is not None),
                                  default=None),
            })
            entry.update({key: value for key, value in measured[0].details.items()
                          if key in ("trainable_parameters", "input")})
            section["runs"].append(entry)
    return section


def _turn_reporter(round_index):
    def report(turn, run, examples_per_sec, background_share):
        _say("training round %d turn %2d: ResNet-%d %-37s %7.1f examples/sec (others used %s "
             "of the CPU)" % (round_index + 1, turn + 1, run.num_layers, run.name,
                              examples_per_sec, _percent(background_share)))
    return report


def _mean(values):
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


def _run(results, name, depth):
    """The run `name` of ResNet-depth, or None where it did not train (--runs)."""
    for run in results["training"]["runs"]:
        if run["name"] == name and run["num_layers"] == depth:
            return run
    return None


def turn_ratios(numerator, denominator):
    """numerator's / denominator's examples/sec in each turn, run back to back, all rounds."""
    return [a / b for rates_a, rates_b in zip(numerator["interval_examples_per_sec"],
                                              denominator["interval_examples_per_sec"])
            for a, b in zip(rates_a, rates_b)]


def _ratio_statistics(ratios):
    """Median and interquartile range of paired ratios."""
    quartiles = (statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1
                 else [ratios[0]] * 3)
    return {"ratio": statistics.median(ratios), "ratio_q25": quartiles[0],
            "ratio_q75": quartiles[2], "pairs": len(ratios)}


def comparisons(results):
    """The ratios the targets are about: medians of paired ratios (turns, or rounds)."""
    rows = []

    def add(key, what, ratios, **extra):
        row = {"key": key, "what": what, "target": TARGETS.get(key)}
        row.update(_ratio_statistics(ratios))
        row["met"] = row["ratio"] >= TARGETS[key] if key in TARGETS else None
        row.update(extra)
        rows.append(row)

    if "input_pipeline" in results:
        pipeline = results["input_pipeline"]
        add("input_pipeline_vs_original",
            "Cifar10DataSet / original input pipeline (batches/sec)",
            [a / b for a, b in zip(pipeline["dataset_examples_per_sec"],
                                   pipeline["original_examples_per_sec"])])
    for depth in results["settings"]["depths"] if "training" in results else ():
        _training_comparisons(results, depth, add)
    if "conversion" in results:
        conversion = results["conversion"]
        add("conversion_vs_original", "generate_tfrecords / original conversion (images/sec)",
            [original / package for original, package in zip(
                conversion["original"]["seconds"], conversion["package"]["seconds"])])
    return rows


def _training_comparisons(results, depth, add):
    """add() the training ratios of ResNet-depth whose both runs trained."""
    def add_if_trained(key, what, numerator, denominator):
        numerator, denominator = _run(results, numerator, depth), _run(results, denominator, depth)
        if not (numerator and denominator):
            return
        extra = {}
        if denominator["kind"] == "keras":  # its copy of the model must be ours
            extra["same_parameter_count"] = (
                denominator.get("trainable_parameters")
                == results["flops"][str(depth)]["trainable_parameters"])
        add(key, "ResNet-%d: %s" % (depth, what), turn_ratios(numerator, denominator),
            num_layers=depth, **extra)

    add_if_trained("real_data_vs_synthetic", "TFRecords / synthetic ceiling",
                   "estimator_tfrecords", "estimator_synthetic")
    add_if_trained("estimator_vs_keras", "Estimator (TFRecords) / Keras model.fit",
                   "estimator_tfrecords", "keras_fit")
    add_if_trained("two_towers_vs_one", "2 CPU towers / 1 tower (synthetic, same global batch)",
                   "estimator_synthetic_2_towers", "estimator_synthetic")
    add_if_trained("pooling_allocator_vs_default", "Estimator (TFRecords), pooling CPU "
                   "allocator / TensorFlow's default", "estimator_tfrecords_pooling_allocator",
                   "estimator_tfrecords")
    if results["precisions"]["bf16"] == "measured":
        add_if_trained("bf16_vs_fp32", "Estimator (TFRecords) --precision bf16 / fp32",
                       "estimator_tfrecords_bf16", "estimator_tfrecords")
        add_if_trained("estimator_vs_keras_bf16", "Estimator bf16 / Keras mixed_bfloat16 "
                       "model.fit", "estimator_tfrecords_bf16", "keras_fit_bf16")
        add_if_trained("pooling_allocator_vs_default_bf16", "Estimator bf16, pooling CPU "
                       "allocator / TensorFlow's default",
                       "estimator_tfrecords_bf16_pooling_allocator", "estimator_tfrecords_bf16")


def console_main():
    sys.exit(run_command(main))

