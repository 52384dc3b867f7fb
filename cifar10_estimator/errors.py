"""Errors a user can cause and fix; command-line tools print them as one line."""


class Cifar10EstimatorError(Exception):
    """A problem with the user's input or environment, with a message that names the fix.

    Command-line tools print the message on one line and exit with status 1.
    """

    exit_status = 1


class UsageError(Cifar10EstimatorError):
    """A bad command-line flag or flag combination (exit status 2, like argparse)."""

    exit_status = 2
