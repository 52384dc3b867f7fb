"""Convert CIFAR-10 to the TFRecord files the training reads, from its archive or image folders.

archive: fetch (download.py) -> verify -> extract and unpickle safely (cifar10_archive.py)
image folders: list and check the layout, decode in parallel (image_folders.py)
-> split validation off the training examples, write train/validation/eval TFRecords
and their counts (this module).

Records are encoded by tfrecord_format (the on-disk format).
"""

import argparse
import contextlib
import dataclasses
import os
import re
import shutil
import sys
import typing

from cifar10_estimator import files
from cifar10_estimator.cli.command import run_command, stderr_dropped_on_user_error
from cifar10_estimator.cli.options import (ArgumentParser, add_options, non_negative_int, option,
                                           option_fields, parse_options, positive_int)
from cifar10_estimator.data import cifar10_archive
from cifar10_estimator.data import cifar10_facts
from cifar10_estimator.data import download
from cifar10_estimator.data import image_folders
from cifar10_estimator.data import tfrecord_format
from cifar10_estimator.errors import Cifar10EstimatorError, UsageError

URL_ENVIRONMENT_VARIABLE = "CIFAR10_DOWNLOAD_URL"
DEFAULT_DOWNLOAD_ATTEMPTS = 5
# Flags that say how to get the archive; they mean nothing with --image-dir.
_ARCHIVE_FLAGS = ("url", "md5", "download_attempts")


def checked_num_validation_examples(num_validation_examples, num_training_examples, source):
    """num_validation_examples, if it leaves at least one of the training examples to train on.

    Raises:
      UsageError: it is negative, or not less than num_training_examples (of `source`).
    """
    if not 0 <= num_validation_examples < num_training_examples:
        raise UsageError(
            "--validation-examples %d is out of range: %s has %d training images, so pick "
            "0..%d (0: no validation set)" % (num_validation_examples, source,
                                              num_training_examples, num_training_examples - 1))
    return num_validation_examples


def split_off_validation(parts, num_validation_examples):
    """Split training examples, in order: the last num_validation_examples become validation.

    Args:
      parts: list of (items, labels), the training examples in order; items (images or
        image paths) are sliced like their labels.
      num_validation_examples: 0 .. number of examples.

    Returns:
      dict 'train' -> list of (items, labels) and, unless num_validation_examples is 0,
      'validation' -> list of (items, labels).
    """
    first_validation = sum(len(labels) for _, labels in parts) - num_validation_examples
    train, validation = [], []
    start = 0
    for items, labels in parts:
        num_train = min(max(first_validation - start, 0), len(labels))
        if num_train:
            train.append((items[:num_train], labels[:num_train]))
        if num_train < len(labels):
            validation.append((items[num_train:], labels[num_train:]))
        start += len(labels)
    return {"train": train, "validation": validation} if num_validation_examples else {
        "train": train}


def write_subsets(data_dir, subset_batches):
    """Write each subset's TFRecord file and then the metadata file, all or nothing.

    All files are written under temporary names and renamed into place only when
    every subset was read and written; the metadata file, last, marks a complete
    set. A failure leaves earlier outputs (if any) untouched.

    Args:
      data_dir: existing output directory.
      subset_batches: dict subset -> iterable of (images uint8 [N, 3072], labels [N]).
        A subset left out gets no file: one of an earlier run is removed, so the data
        dir holds only what its metadata lists.

    Returns:
      dict subset -> number of examples written.
    """
    num_examples = {}
    # Each file's rename waits for the block's end, when every subset is written.
    with contextlib.ExitStack() as renames:
        for subset in cifar10_facts.SUBSETS:
            if subset in subset_batches:
                num_examples[subset] = renames.enter_context(
                    tfrecord_format.tfrecords_written_whole(
                        tfrecord_format.tfrecord_path(data_dir, subset), subset_batches[subset]))
        metadata = tfrecord_format.metadata_path(data_dir)
        if os.path.exists(metadata):
            os.remove(metadata)
        for subset in cifar10_facts.SUBSETS:
            path = tfrecord_format.tfrecord_path(data_dir, subset)
            if subset not in num_examples and os.path.exists(path):
                os.remove(path)
    tfrecord_format.write_metadata(data_dir, num_examples)
    return num_examples


def convert_batches(batches_dir, data_dir, num_validation_examples=None):
    """Write train/validation/eval TFRecords and the metadata file from extracted batches.

    Args:
      batches_dir: directory holding the six batches.
      data_dir: output directory.
      num_validation_examples: how many of the last training examples (data_batch_1..5
        in order) validate; None keeps the tutorial's split (data_batch_5), 0 writes
        no validation set.

    Returns:
      dict subset -> number of examples written.

    Raises:
      Cifar10EstimatorError: a batch is unreadable or not a CIFAR-10 batch.
      UsageError: num_validation_examples leaves no training examples.
    """
    def load(subset):
        return [cifar10_archive.load_batch(os.path.join(batches_dir, name))
                for name in cifar10_archive.SUBSET_BATCHES[subset]]

    train_batches, validation_batches = load("train"), load("validation")
    if num_validation_examples is None:
        num_validation_examples = sum(len(labels) for _, labels in validation_batches)
    training = train_batches + validation_batches
    num_validation_examples = checked_num_validation_examples(
        num_validation_examples, sum(len(labels) for _, labels in training), batches_dir)
    subset_batches = split_off_validation(training, num_validation_examples)
    subset_batches["eval"] = (cifar10_archive.load_batch(os.path.join(batches_dir, name))
                              for name in cifar10_archive.SUBSET_BATCHES["eval"])
    return write_subsets(data_dir, subset_batches)


def obtain_batches(data_dir, url, md5, download_attempts, messages):
    """Directory holding the six batches: from data_dir's archive, an extracted copy, or a download.

    Args:
      data_dir: existing directory for the archive, the batches and the outputs.
      url: where to download the archive from when data_dir has neither.
      md5: expected hex MD5 of the archive, or None to skip checks. A download
        must match it; an archive already in data_dir only earns a warning.
      download_attempts: requests to make before a download gives up.
      messages: text stream for progress and warnings.
    """
    archive = os.path.join(data_dir, cifar10_archive.ARCHIVE_FILENAME)
    if not os.path.exists(archive):
        if cifar10_archive.has_extracted_batches(data_dir):
            print("using the batches in %s" % cifar10_archive.batches_dir(data_dir), file=messages)
            return cifar10_archive.batches_dir(data_dir)
        download.download(url, archive, md5=md5, max_attempts=download_attempts,
                          progress_stream=messages)
    elif md5 is not None:
        actual_md5 = download.file_md5(archive)
        if actual_md5 != md5:
            print("warning: %s has MD5 %s, not %s; converting it anyway (fine for a "
                  "CIFAR-format archive of other data)" % (archive, actual_md5, md5),
                  file=messages)
    print("extracting the batches from %s" % archive, file=messages)
    return cifar10_archive.extract_batches(archive, data_dir)


def remove_stale_temporaries(data_dir):
    """Delete what a killed conversion left in data_dir: the temporaries of its outputs
    (files.written_whole's) and its staged batches.

    A finished run removes its own; these are the files and directories of runs that
    were killed outright (they never look finished, but they take space).
    """
    outputs = [os.path.basename(tfrecord_format.tfrecord_path(data_dir, subset))
               for subset in cifar10_facts.SUBSETS]
    outputs.append(os.path.basename(tfrecord_format.metadata_path(data_dir)))
    staged_batches_prefix = "." + cifar10_archive.BATCHES_DIRNAME + "."
    for name in os.listdir(data_dir):
        path = os.path.join(data_dir, name)
        if name.startswith(staged_batches_prefix):
            shutil.rmtree(path, ignore_errors=True)
        elif any(files.is_temporary_of(name, output) for output in outputs):
            os.remove(path)


def convert(data_dir, url=cifar10_archive.OFFICIAL_URL, md5=cifar10_archive.OFFICIAL_MD5,
            download_attempts=DEFAULT_DOWNLOAD_ATTEMPTS, messages=None,
            num_validation_examples=None):
    """Fetch CIFAR-10 into data_dir if needed, then write its TFRecords and metadata.

    See `obtain_batches` for where the data comes from and the arguments, and
    `convert_batches` for num_validation_examples.

    Returns:
      dict subset -> number of examples written (40000/10000/10000 for CIFAR-10).

    Raises:
      Cifar10EstimatorError: the data cannot be fetched, verified or read.
      UsageError: num_validation_examples leaves no training examples.
    """
    messages = messages or sys.stderr
    os.makedirs(data_dir, exist_ok=True)
    remove_stale_temporaries(data_dir)
    batches_dir = obtain_batches(data_dir, url, md5, download_attempts, messages)
    return convert_batches(batches_dir, data_dir, num_validation_examples)


def convert_image_folders(image_dir, data_dir, num_validation_examples=None, messages=None):
    """Write train/validation/eval TFRecords and the metadata file from folders of images.

    The whole layout is checked before anything is decoded; see image_folders for
    the layout, the fixed order of the training images and how images are decoded.

    Args:
      image_dir: folder holding train/<class>/ and test/<class>/.
      data_dir: output directory, created if missing.
      num_validation_examples: how many of the last training images (in their fixed
        order) validate; None: the last fifth, as data_batch_5 is of the archive's
        training images; 0: no validation set.
      messages: text stream for progress lines (default: stderr).

    Returns:
      dict subset -> number of examples written.

    Raises:
      Cifar10EstimatorError: naming a folder or file that does not fit the layout, or
        an image that cannot be decoded or is not 32x32.
      UsageError: num_validation_examples leaves no training examples.
    """
    messages = messages or sys.stderr
    listing = image_folders.list_images(image_dir)
    num_training_examples = len(listing["train"][1])
    if num_validation_examples is None:
        num_validation_examples = num_training_examples // 5
    num_validation_examples = checked_num_validation_examples(
        num_validation_examples, num_training_examples,
        os.path.join(image_dir, image_folders.SPLIT_DIRNAMES["train"]))
    subset_paths = split_off_validation([listing["train"]], num_validation_examples)
    subset_paths["eval"] = [listing["eval"]]
    os.makedirs(data_dir, exist_ok=True)
    remove_stale_temporaries(data_dir)
    return write_subsets(data_dir, {
        subset: _decoded_parts(parts, subset, messages) for subset, parts in subset_paths.items()})


def _decoded_parts(parts, subset, messages):
    """Yields the decoded batches of each (paths, labels) in parts, in order."""
    for paths, labels in parts:
        yield from image_folders.decoded_batches(paths, labels, subset, messages)


def _md5_flag(text):
    if text.lower() == "none":
        return None
    if re.fullmatch(r"[0-9a-fA-F]{32}", text):
        return text.lower()
    raise argparse.ArgumentTypeError("expected 32 hex digits or 'none', got %r" % text)


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """The command line: where the TFRecords go, the source, and how to fetch the archive."""

    data_dir: str = option(
        None, "output directory for the TFRecords (created if missing); for the archive "
              "source also the directory of the archive and the extracted batches",
        required=True, metavar="DIR")
    image_dir: typing.Optional[str] = option(
        None, "convert the image folders IMAGES/train/<class>/ and IMAGES/test/<class>/ "
              "instead of the archive (no download); see below",
        metavar="IMAGES")
    validation_examples: typing.Optional[int] = option(
        None, "the last N training images validate (default: data_batch_5 or the last "
              "fifth; 0: no validation set)",
        type=non_negative_int, metavar="N")
    # The archive's options have no value unless given (see _archive_options): one given
    # with --image-dir is an error.
    url: str = option(
        argparse.SUPPRESS, "where to download the archive from (default: $%s if set, else "
                           "the official URL below)" % URL_ENVIRONMENT_VARIABLE)
    md5: str = option(
        argparse.SUPPRESS, "expected MD5 of the archive (default: the official archive's); "
                           "'none' skips the check. Set it to download a CIFAR-format "
                           "archive of other data.",
        type=_md5_flag, metavar="HEX|none")
    download_attempts: int = option(
        argparse.SUPPRESS, "requests to make before a broken download gives up (default: "
                           "%d)" % DEFAULT_DOWNLOAD_ATTEMPTS,
        type=positive_int, metavar="N")


def build_parser():
    parser = ArgumentParser(
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert CIFAR-10 into the TFRecord files the training reads, from the\n"
                    "CIFAR-10 python archive (default) or from folders of images (--image-dir):\n"
                    "  train.tfrecords       training images       data_batch_1..4  (40000)\n"
                    "  validation.tfrecords  last training images  data_batch_5     (10000)\n"
                    "  eval.tfrecords        test images           test_batch       (10000)\n"
                    "and {metadata} with the number of examples in each.\n"
                    "Image folders give the same counts for CIFAR-10's 50000 training and\n"
                    "10000 test images; --validation-examples moves the split.".format(
                        metadata=tfrecord_format.METADATA_FILENAME),
        epilog="Validation split (--validation-examples N): the last N training images\n"
               "validate and the rest train. Default: data_batch_5 for the archive, the last\n"
               "fifth for image folders (10000 of 50000 either way). For the archive the\n"
               "training images are data_batch_1..5 in order, so N=5000 validates on the\n"
               "second half of data_batch_5. N=0 trains on all of them and writes no\n"
               "validation.tfrecords (one from an earlier run is removed); the metadata\n"
               "then lists no validation set.\n"
               "\n"
               "Where the archive comes from (the first that applies):\n"
               "  1. DIR/{archive} if present. To work offline, place the\n"
               "     archive there yourself. One whose MD5 differs from --md5 is converted\n"
               "     with a warning, so CIFAR-format archives of other data work.\n"
               "  2. DIR/{batches}/ if it holds the six batches.\n"
               "  3. Otherwise the archive is downloaded from --url into DIR (progress on\n"
               "     stderr; broken transfers are retried and resumed from\n"
               "     DIR/{archive}.part) and must match --md5, or it is removed.\n"
               "The official archive: {url}\n"
               "with MD5 {md5}.\n"
               "\n"
               "Image folders (--image-dir IMAGES), as in the public CIFAR-10-images\n"
               "repository: IMAGES/train/<class>/ and IMAGES/test/<class>/ (test becomes\n"
               "eval.tfrecords), one folder per class, named (labels 0..9 in this order)\n"
               "  {classes}\n"
               "and holding 32x32 {extensions} files; nothing else of IMAGES is read.\n"
               "Names starting with '.' (.DS_Store, ...) are skipped; any other file or\n"
               "folder is an error naming it. Each class's images are read in file-name\n"
               "order and decoded by TensorFlow (JPEG with the accurate integer IDCT: the\n"
               "pixels Pillow and libjpeg give); grayscale is expanded to RGB and an alpha\n"
               "channel dropped (not blended). Training images are then put in a fixed\n"
               "shuffled order (seed {seed}) that spreads each class evenly, so the\n"
               "validation images at its end are balanced across classes; test images\n"
               "stay in class, then file-name order. Progress on stderr.\n"
               "\n"
               "Outputs are written under temporary names and renamed when complete, so a\n"
               "failed run never leaves files that look finished; just run it again.".format(
                   archive=cifar10_archive.ARCHIVE_FILENAME,
                   batches=cifar10_archive.BATCHES_DIRNAME,
                   url=cifar10_archive.OFFICIAL_URL, md5=cifar10_archive.OFFICIAL_MD5,
                   classes=", ".join(cifar10_facts.CLASS_NAMES),
                   extensions="/".join(image_folders.IMAGE_EXTENSIONS),
                   seed=image_folders.TRAIN_ORDER_SEED))
    add_options(parser, option_fields(GenerateOptions))
    return parser


def _archive_options(args, given):
    """convert()'s url, md5 and download_attempts: the flags given, else their defaults."""
    return {"url": (args.url if "url" in given else None)
            or os.environ.get(URL_ENVIRONMENT_VARIABLE) or cifar10_archive.OFFICIAL_URL,
            "md5": args.md5 if "md5" in given else cifar10_archive.OFFICIAL_MD5,
            "download_attempts": (args.download_attempts if "download_attempts" in given
                                  else DEFAULT_DOWNLOAD_ATTEMPTS)}


def _convert_image_folders_with_one_line_errors(args, given):
    """convert_image_folders for the command line: progress live, a failure one line."""
    misplaced = [name for name in _ARCHIVE_FLAGS if name in given]
    if misplaced:
        raise UsageError("--%s is for the archive source; drop it with --image-dir"
                         % misplaced[0].replace("_", "-"))
    # libjpeg reports a corrupt file on file descriptor 2 by itself: fd 2 is held back so a
    # bad image gives only the error line, and a copy of it keeps progress visible meanwhile.
    with os.fdopen(os.dup(2), "w") as live_stderr, stderr_dropped_on_user_error():
        return convert_image_folders(args.image_dir, args.data_dir, args.validation_examples,
                                     messages=live_stderr)


def main(argv):
    values, given = parse_options(build_parser(), option_fields(GenerateOptions), argv)
    args = GenerateOptions(**values)
    # TensorFlow only writes records here; its C++ start-up notices would bury our messages.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        if args.image_dir is None:
            num_examples = convert(args.data_dir, num_validation_examples=args.validation_examples,
                                   **_archive_options(args, given))
        else:
            num_examples = _convert_image_folders_with_one_line_errors(args, given)
    except download.DownloadError as error:
        raise download.DownloadError("%s; place %s in %s or pass --url" % (
            error, cifar10_archive.ARCHIVE_FILENAME, args.data_dir))
    except download.ChecksumMismatch as error:
        raise download.ChecksumMismatch(
            "%s; pass --md5 HEX to expect another file, or --md5 none to skip the check" % error)
    except OSError as error:
        raise Cifar10EstimatorError("cannot read or write %s: %s" % (
            error.filename or args.data_dir, error.strerror or error))
    for subset in cifar10_facts.SUBSETS:
        if subset in num_examples:
            print("%-10s %6d examples  %s" % (
                subset, num_examples[subset], tfrecord_format.tfrecord_path(args.data_dir, subset)))
    print("counts in %s" % tfrecord_format.metadata_path(args.data_dir))
    return 0


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
