"""CIFAR-10's facts: image shape, classes, subsets and the official split's sizes; and the
training crops' padding, which the data set, the flags and the benchmarks share.

They sit at the start of the data's path: the archive reader, the image folders and the
TFRecord format take them from here, and cifar10.py hands them on to everything after
the records (cifar10.HEIGHT, cifar10.CLASS_NAMES, ...), as the tutorial's cifar10.py did.
The flags and the commands that check theirs before TensorFlow loads take them from here
too: this module imports nothing.
"""

HEIGHT = 32
WIDTH = 32
DEPTH = 3
NUM_CLASSES = 10
CLASS_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)
# The subsets, named as the original tutorial named them and their files
# (train.tfrecords, validation.tfrecords, eval.tfrecords): "eval" is the test set
# (CIFAR-10's test_batch). Hence --eval-subset eval and --subset eval mean the test set,
# while the trainer's folders and files say test where "eval" would be ambiguous:
# job-dir/eval_test/ and test_results.json hold the one test evaluation,
# job-dir/eval_validation/ the evaluations on the validation set during training.
SUBSETS = ("train", "validation", "eval")
# Examples per subset of the official split (data_batch_1-4 / data_batch_5 / test_batch),
# the counts of data without a metadata file (records written by the original tutorial).
OFFICIAL_NUM_EXAMPLES = {"train": 40000, "validation": 10000, "eval": 10000}

# Training crops come from the image zero-padded by MAX_SHIFT pixels on each side, so a
# crop moves it by up to MAX_SHIFT pixels along each axis (the tutorial's pad-4 crop).
MAX_SHIFT = 4
PADDED_HEIGHT = HEIGHT + 2 * MAX_SHIFT
PADDED_WIDTH = WIDTH + 2 * MAX_SHIFT


def check_subset(subset):
    """Raises ValueError unless subset is one of SUBSETS."""
    if subset not in SUBSETS:
        raise ValueError("subset must be one of %s, got %r" % (", ".join(SUBSETS), subset))
