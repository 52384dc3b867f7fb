"""Where a training job's evaluations go under its job dir, as tf.estimator names them.

The Estimator writes an evaluation named N into job-dir/eval_N/ and an unnamed one into
job-dir/eval/. The trainer names its evaluations during training on the validation set
("validation"), leaves those on the test set unnamed (as the original did), and names its
one final test evaluation report.TEST_EVAL_NAME. Imports nothing: the curves command reads
these folders before TensorFlow loads.
"""

VALIDATION_EVAL_NAME = "validation"


def evaluation_dir(name):
    """The folder under the job dir of the Estimator's evaluation `name` (None: unnamed)."""
    return "eval" if name is None else "eval_" + name


# The evaluations during training on the validation set, and on the test set where the
# job has no validation set or was told --eval-subset eval.
VALIDATION_DIR = evaluation_dir(VALIDATION_EVAL_NAME)
TEST_DURING_TRAINING_DIR = evaluation_dir(None)
