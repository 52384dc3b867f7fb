"""The benchmark's results (suite.run_benchmarks) as a Markdown report."""

from cifar10_estimator.benchmarks import host
from cifar10_estimator.cli.markdown import markdown_table


def _rounds(values, fmt="%.0f"):
    return ", ".join(fmt % value for value in values)


def _machine_lines(results):
    machine = results["machine"]
    peak = machine["fp32_peak_gflops"]
    return [
        "- Command: `%s`" % results["command"],
        "- Date: %s; took %.1f min" % (machine["date"], results["duration_secs"] / 60),
        "- CPU: %s, %d physical cores usable (%d logical CPUs), %s MHz (%s), %s"
        % (host.cpu_identity(machine), machine["physical_cores"],
           machine["logical_cpus"],
           "%.0f" % machine["clock_mhz"] if machine["clock_mhz"] else "unknown",
           machine["clock_source"], machine["vector_isa"]),
        "- FP32 peak: %s = %s" % ("%.1f GFLOP/s" % peak if peak else "unknown",
                                  machine["fp32_peak_derivation"]),
        "- bf16 peak: %s = %s" % (
            "%.1f GFLOP/s" % machine["bf16_peak_gflops"] if machine["bf16_peak_gflops"]
            else "none", machine["bf16_peak_derivation"]),
        "- Precisions: %s" % "; ".join("%s %s" % (name, note)
                                       for name, note in results["precisions"].items()),
        "- Memory: %.0f GiB; TensorFlow %s; Python %s; %s"
        % (machine["memory_gib"] or 0, machine["tensorflow_version"],
           machine["python_version"], machine["platform"]),
        "- Load average (1/5/15 min, the benchmark's own runs included) at start %s, at end "
        "%s; other processes took %s of the CPU time while it ran"
        % (_load(results["load_average_start"]), _load(results["load_average_end"]),
           "unknown" if results["background_cpu_share"] is None
           else "%.0f %%" % (100 * results["background_cpu_share"])),
    ]


def _load(values):
    return " / ".join("%.2f" % value for value in values) if values else "unknown"


def _targets_table(results):
    rows = []
    for row in results["comparisons"]:
        target = "-" if row["target"] is None else "≥ %.2f" % row["target"]
        met = "-" if row["met"] is None else ("yes" if row["met"] else "**no**")
        rows.append([row["what"], "%.3f" % row["ratio"],
                     "%.3f-%.3f" % (row["ratio_q25"], row["ratio_q75"]), row["pairs"],
                     target, met])
    return markdown_table(["Comparison", "Ratio (median)", "Interquartile range", "Pairs",
                           "Target", "Met"], rows)


def _peak_share(results, run, achieved_gflops):
    """'S % of FP32' (or of bf16, for a bf16 run): the share of the peak it computes in."""
    is_bf16 = "bf16" in run["extra_flags"]
    peak = results["machine"]["bf16_peak_gflops" if is_bf16 else "fp32_peak_gflops"]
    if not peak:
        return "-"
    return "%.1f %% of %s" % (100 * achieved_gflops / peak, "bf16" if is_bf16 else "FP32")


def _training_table(results):
    rows = []
    for run in results["training"]["runs"]:
        flops = results["flops"][str(run["num_layers"])]["train_step_flops_per_example"]
        achieved_gflops = flops * run["median_examples_per_sec"] / 1e9
        background = run["mean_background_cpu_share"]
        rows.append([
            "ResNet-%d" % run["num_layers"], run["description"],
            _rounds(run["examples_per_sec"], "%.1f"), "%.1f" % run["median_examples_per_sec"],
            "-" if background is None else "%.0f" % (100 * background),
            "%.1f" % achieved_gflops, _peak_share(results, run, achieved_gflops),
            "-" if run["max_rss_mb"] is None else "%.0f" % run["max_rss_mb"], _rounds(run["process_cpu_secs"])])
    return markdown_table(["Model", "Run", "examples/sec per round", "Median",
                           "Others' CPU %", "GFLOP/s", "Share of peak", "Peak RSS MB",
                           "Process CPU s per round"], rows)


def _input_table(results):
    section = results["input_pipeline"]
    return markdown_table(["Pipeline", "examples/sec per round", "CPU ms/batch"], [
        ["original tutorial (per-record map, shuffle buffer)",
         _rounds(section["original_examples_per_sec"]),
         "%.2f" % section["original_cpu_ms_per_batch"]],
        ["Cifar10DataSet", _rounds(section["dataset_examples_per_sec"]),
         "%.2f" % section["dataset_cpu_ms_per_batch"]],
    ])


def _conversion_table(results):
    section = results["conversion"]
    rows = []
    for way, label in (("original", "original (extractall, one tf.train.Example per image)"),
                       ("package", "generate_tfrecords.convert (MD5 check included)")):
        rows.append([label, _rounds(section[way]["seconds"], "%.2f"),
                     _rounds(section[way]["cpu_seconds"], "%.2f"),
                     "%.0f" % section[way]["median_images_per_sec"]])
    return markdown_table(["Way", "seconds per round", "CPU seconds", "Median images/sec"],
                          rows)


def _flops_table(results):
    rows = []
    for depth, counts in sorted(results["flops"].items(), key=lambda item: int(item[0])):
        keras = [run for run in results["training"]["runs"]
                 if run["name"] == "keras_fit" and str(run["num_layers"]) == depth]
        keras_parameters = keras[0].get("trainable_parameters", "-") if keras else "-"
        rows.append(["ResNet-%s" % depth, "%.1f" % (counts["forward_flops_per_example"] / 1e6),
                     "%.1f" % (counts["train_step_flops_per_example"] / 1e6),
                     "%d / %s" % (counts["trainable_parameters"], keras_parameters),
                     ", ".join(counts["uncounted_op_types"]) or "-"])
    return markdown_table(["Model", "Forward MFLOPs/example", "Training step MFLOPs/example",
                           "Trainable parameters (ours / Keras)", "Op types counted as 0"],
                          rows)


def summary(results):
    """The targets table under the CPU it was measured on, for the console."""
    return "\n".join(["Targets, measured on %s:"
                      % host.cpu_identity(results["machine"]), "",
                      _targets_table(results)])


def markdown(results):
    """The report: machine, targets, then one table per section measured."""
    cpu = host.cpu_identity(results["machine"])
    parts = [
        "# cifar10_estimator benchmark (%s)" % results["mode"], "",
        "\n".join(_machine_lines(results)), "",
        "## Targets (%s)" % cpu, "", _targets_table(results), "",
    ]
    if "training" in results:
        parts += _training_part(results, cpu)
    if "input_pipeline" in results:
        parts += [
            "## Input pipeline (%s)" % cpu, "",
            "Train batches of %d with augmentation, graph mode, same file; original and "
            "Cifar10DataSet alternated." % results["input_pipeline"]["batch_size"], "",
            _input_table(results), "",
        ]
    if "conversion" in results:
        conversion = results["conversion"]
        parts += [
            "## TFRecord conversion (%s)" % cpu, "",
            "%d random images in an official-format archive (%.0f MB, Python 2 pickles); both "
            "ways extract and write train/validation/eval; same examples written both ways: %s."
            % (conversion["num_images"], conversion["archive_bytes"] / 1e6,
               "yes" if conversion["same_examples_both_ways"] else "**no**"), "",
            _conversion_table(results), "",
        ]
    if "flops" in results:
        parts += [
            "## Model FLOPs", "",
            "Counted by `tf.compat.v1.profiler` (float_operation) on the inference graph and "
            "on the package's one-tower training graph; op types without a registered FLOPs "
            "statistic count 0.", "",
            _flops_table(results), "",
        ]
    return "\n".join(parts)


def _training_part(results, cpu):
    training = results["training"]
    return [
        "## Training throughput (%s)" % cpu, "",
        "Batch %d, CPU only (`--num-gpus 0`). The runs of one model are child processes "
        "started together; after %d warm-up steps each is paused, then they take turns of "
        "%d steps (in order, then in reverse order, ...) while the others stay paused, %d "
        "timed steps each per round, %d round(s) with fresh processes. Start-up, graph "
        "building, warm-up, the final checkpoint and evaluation are never timed. A ratio "
        "above is the median "
        "of per-turn ratios of turns run back to back, so load on a shared machine falls on "
        "both sides alike. Others' CPU: share of all cores other processes (and hypervisor "
        "steal) took during the run's turns. GFLOP/s = training-step FLOPs per example "
        "(below) x median examples/sec. Keras: TF2 `model.fit` of a functional copy of the "
        "same ResNet (same parameter count, loss, weight decay, momentum and learning rate) "
        "on the same Cifar10DataSet batches (tf.data from the same TFRecords). Every run uses "
        "TensorFlow's default CPU allocator, as the trainer does, except those marked "
        "TF_CPU_ALLOCATOR_USE_BFC=true (the pooling allocator a user can opt into). "
        "bf16 runs: the trainer's `--precision bf16` and Keras's `mixed_bfloat16` "
        "policy; their share is of the bf16 peak, the others' of the FP32 peak. "
        "Peak RSS: the process's own high-water mark (VmHWM)."
        % (training["batch_size"], training["warmup_steps"], training["steps_per_turn"],
           training["timed_steps"], training["rounds"]), "",
        _training_table(results), "",
    ]
