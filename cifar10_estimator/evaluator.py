"""What the evaluator does beside training: one checkpoint evaluated with its exports, and
the evaluator task's loop.

evaluate_and_export is what tf.estimator's evaluator does with one checkpoint; the
trainer also calls it for a job whose training was already done. evaluate_until_final
is a cluster's evaluator task. tf.estimator's own evaluator sleeps up to throttle_secs
(--eval-every-secs, 600 s by default) after each evaluation, so a final checkpoint
written during that sleep waits for it. This loop looks for a new checkpoint every
CHECKPOINT_POLL_SECS instead: it evaluates one once --eval-every-secs have passed since
the last evaluation started, and the final one (global step >= the last training step)
as soon as it appears. Each evaluation and export is the one tf.estimator's evaluator
makes.
"""

import os
import time

import tensorflow as tf

from cifar10_estimator.serving import export_dirs

CHECKPOINT_POLL_SECS = 2


def evaluate_and_export(estimator, eval_spec, checkpoint, is_the_final_export):
    """Evaluate `checkpoint` as eval_spec says, then run its exporters, as tf.estimator does.

    Returns:
      The evaluation metrics (dict, with global_step).
    """
    metrics = estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps, name=eval_spec.name,
                                 checkpoint_path=checkpoint, hooks=eval_spec.hooks)
    for exporter in eval_spec.exporters:
        exporter.export(estimator, os.path.join(estimator.model_dir,
                                                export_dirs.EXPORT_SUBDIR, exporter.name),
                        checkpoint, metrics, is_the_final_export)
    return metrics


def evaluate_until_final(estimator, eval_spec, max_steps, stop_signals=None):
    """Evaluate new checkpoints of estimator.model_dir until one at max_steps or later.

    Args:
      estimator: the tf.estimator.Estimator whose model_dir the chief writes to.
      eval_spec: the EvalSpec; its throttle_secs is the least time between the starts
        of two evaluations, except for the final checkpoint.
      max_steps: the global step training ends at.
      stop_signals: the process's stop_signals.StopSignals, or None: a stop signal then
        ends the wait between evaluations (an evaluation ends by eval_spec's hooks).

    Returns:
      The metrics of the final checkpoint's evaluation (dict).
    """
    tf.compat.v1.logging.info("Evaluating new checkpoints in %s until one at step %d or later",
                              estimator.model_dir, max_steps)
    last_evaluated = last_reported = None
    last_start = -float("inf")
    while True:
        checkpoint = estimator.latest_checkpoint()
        if checkpoint and checkpoint != last_evaluated:
            # The step stored inside, not the one in the name: an asynchronous worker
            # may move the global step while the chief saves.
            try:
                is_final = tf.train.load_variable(
                    checkpoint, tf.compat.v1.GraphKeys.GLOBAL_STEP) >= max_steps
            except tf.errors.NotFoundError:  # the chief already deleted it for a newer one
                time.sleep(CHECKPOINT_POLL_SECS)
                continue
            waited_secs = time.monotonic() - last_start
            if is_final or waited_secs >= eval_spec.throttle_secs:
                last_start, last_evaluated = time.monotonic(), checkpoint
                metrics = evaluate_and_export(estimator, eval_spec, checkpoint, is_final)
                if is_final:
                    tf.compat.v1.logging.info("Exiting evaluation, global_step=%d >= train "
                                              "max_steps=%d", metrics["global_step"], max_steps)
                    return metrics
            elif checkpoint != last_reported:
                last_reported = checkpoint
                tf.compat.v1.logging.info(
                    "Not evaluating %s yet: the last evaluation started %d s ago "
                    "(--eval-every-secs %d); the final checkpoint is evaluated at once",
                    os.path.basename(checkpoint), waited_secs, eval_spec.throttle_secs)
        if stop_signals is not None:
            stop_signals.raise_if_requested(
                "while waiting for a checkpoint to evaluate; restarted, the evaluator "
                "evaluates the newest one")
        time.sleep(CHECKPOINT_POLL_SECS)
