"""Convert CIFAR-10 (python version) to the TFRecord files the training reads.

fetch (download.py) -> verify -> extract and unpickle safely (cifar10_archive.py)
-> write train/validation/eval TFRecords and their counts (this module).

Records are encoded by tfrecord_format (the on-disk format).
"""

import argparse
import os
import re
import shutil
import sys

from cifar10_estimator import tfrecord_format
from cifar10_estimator.data import cifar10_archive
from cifar10_estimator.data import download
from cifar10_estimator.cli import ArgumentParser, run_command
from cifar10_estimator.errors import Cifar10EstimatorError

URL_ENVIRONMENT_VARIABLE = "CIFAR10_DOWNLOAD_URL"
DEFAULT_DOWNLOAD_ATTEMPTS = 5


def convert_batches(batches_dir, data_dir):
    """Write train/validation/eval TFRecords and the metadata file from extracted batches.

    All three files are written under temporary names and renamed into place only
    when all batches were read and written; the metadata file, last, marks a
    complete set. A failure leaves earlier outputs (if any) untouched.

    Returns:
      dict subset -> number of examples written.

    Raises:
      Cifar10EstimatorError: a batch is unreadable or not a CIFAR-10 batch.
    """
    staged = {}
    try:
        for subset in tfrecord_format.SUBSETS:
            batch_paths = [os.path.join(batches_dir, name)
                           for name in cifar10_archive.SUBSET_BATCHES[subset]]
            staged[subset] = tfrecord_format.write_temporary_tfrecords(
                tfrecord_format.tfrecord_path(data_dir, subset),
                (cifar10_archive.load_batch(path) for path in batch_paths))
        metadata = tfrecord_format.metadata_path(data_dir)
        if os.path.exists(metadata):
            os.remove(metadata)
        for subset, (temporary, _) in staged.items():
            os.replace(temporary, tfrecord_format.tfrecord_path(data_dir, subset))
        num_examples = {subset: count for subset, (_, count) in staged.items()}
        tfrecord_format.write_metadata(data_dir, num_examples)
        return num_examples
    finally:
        for temporary, _ in staged.values():
            if os.path.exists(temporary):
                os.remove(temporary)


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
    """Delete what a killed conversion left in data_dir: hidden partial outputs and batches.

    A finished run removes its own; these are the files and directories of runs that
    were killed outright (they never look finished, but they take space).
    """
    output_names = [os.path.basename(tfrecord_format.tfrecord_path(data_dir, subset))
                    for subset in tfrecord_format.SUBSETS]
    stale_prefixes = tuple("." + name + "." for name in output_names) + (
        "." + cifar10_archive.BATCHES_DIRNAME + ".",)
    metadata_temporary = os.path.basename(tfrecord_format.metadata_path(data_dir)) + ".tmp"
    for name in os.listdir(data_dir):
        path = os.path.join(data_dir, name)
        if name.startswith(stale_prefixes) or name == metadata_temporary:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)


def convert(data_dir, url=cifar10_archive.OFFICIAL_URL, md5=cifar10_archive.OFFICIAL_MD5,
            download_attempts=DEFAULT_DOWNLOAD_ATTEMPTS, messages=None):
    """Fetch CIFAR-10 into data_dir if needed, then write its TFRecords and metadata.

    See `obtain_batches` for where the data comes from and the arguments.

    Returns:
      dict subset -> number of examples written (40000/10000/10000 for CIFAR-10).

    Raises:
      Cifar10EstimatorError: the data cannot be fetched, verified or read.
    """
    messages = messages or sys.stderr
    os.makedirs(data_dir, exist_ok=True)
    remove_stale_temporaries(data_dir)
    batches_dir = obtain_batches(data_dir, url, md5, download_attempts, messages)
    return convert_batches(batches_dir, data_dir)


def _md5_flag(text):
    if text.lower() == "none":
        return None
    if re.fullmatch(r"[0-9a-fA-F]{32}", text):
        return text.lower()
    raise argparse.ArgumentTypeError("expected 32 hex digits or 'none', got %r" % text)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % text)
    return value


def build_parser():
    parser = ArgumentParser(
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert CIFAR-10 (python version) into the TFRecord files the training "
                    "reads:\n"
                    "  train.tfrecords       data_batch_1..4  (40000 images)\n"
                    "  validation.tfrecords  data_batch_5     (10000 images)\n"
                    "  eval.tfrecords        test_batch       (10000 images)\n"
                    "and %s with the number of examples in each."
                    % tfrecord_format.METADATA_FILENAME,
        epilog="Where the data comes from (the first that applies):\n"
               "  1. DIR/{archive} if present. To work offline, place the\n"
               "     archive there yourself. One whose MD5 differs from --md5 is converted\n"
               "     with a warning, so CIFAR-format archives of other data work.\n"
               "  2. DIR/{batches}/ if it holds the six batches.\n"
               "  3. Otherwise the archive is downloaded from --url into DIR (progress on\n"
               "     stderr; broken transfers are retried and resumed from\n"
               "     DIR/{archive}.part) and must match --md5, or it is removed.\n"
               "\n"
               "The official archive: {url}\n"
               "with MD5 {md5}.\n"
               "\n"
               "Outputs are written under temporary names and renamed when complete, so a\n"
               "failed run never leaves files that look finished; just run it again.".format(
                   archive=cifar10_archive.ARCHIVE_FILENAME,
                   batches=cifar10_archive.BATCHES_DIRNAME,
                   url=cifar10_archive.OFFICIAL_URL, md5=cifar10_archive.OFFICIAL_MD5))
    parser.add_argument(
        "--data-dir", required=True, metavar="DIR",
        help="directory for the archive, the extracted batches and the TFRecords "
             "(created if missing)")
    parser.add_argument(
        "--url", default=os.environ.get(URL_ENVIRONMENT_VARIABLE) or cifar10_archive.OFFICIAL_URL,
        help="where to download the archive from (default: $%s if set, else the official "
             "URL below)" % URL_ENVIRONMENT_VARIABLE)
    parser.add_argument(
        "--md5", type=_md5_flag, default=cifar10_archive.OFFICIAL_MD5, metavar="HEX|none",
        help="expected MD5 of the archive (default: the official archive's); 'none' skips "
             "the check. Set it to download a CIFAR-format archive of other data.")
    parser.add_argument(
        "--download-attempts", type=_positive_int, default=DEFAULT_DOWNLOAD_ATTEMPTS, metavar="N",
        help="requests to make before a broken download gives up (default: %(default)s)")
    return parser


def main(argv):
    args = build_parser().parse_args(argv)
    # TensorFlow only writes records here; its C++ start-up notices would bury our messages.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        num_examples = convert(args.data_dir, url=args.url, md5=args.md5,
                               download_attempts=args.download_attempts)
    except download.DownloadError as error:
        raise download.DownloadError("%s; place %s in %s or pass --url" % (
            error, cifar10_archive.ARCHIVE_FILENAME, args.data_dir))
    except download.ChecksumMismatch as error:
        raise download.ChecksumMismatch(
            "%s; pass --md5 HEX to expect another file, or --md5 none to skip the check" % error)
    except OSError as error:
        raise Cifar10EstimatorError("cannot read or write %s: %s" % (
            error.filename or args.data_dir, error.strerror or error))
    for subset in tfrecord_format.SUBSETS:
        print("%-10s %6d examples  %s" % (subset, num_examples[subset],
                                          tfrecord_format.tfrecord_path(args.data_dir, subset)))
    print("counts in %s" % tfrecord_format.metadata_path(args.data_dir))
    return 0


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
