"""Errors a user can cause and fix; command-line tools print them as one line."""


class Cifar10EstimatorError(Exception):
    """A problem with the user's input or environment, with a message that names the fix.

    Command-line tools print the message on one line and exit with status 1.
    """

    exit_status = 1


class UsageError(Cifar10EstimatorError):
    """A bad command-line flag or flag combination (exit status 2, like argparse)."""

    exit_status = 2


class RunStopped(Exception):
    """A run that ended because it was asked to (SIGTERM, Ctrl-C), not by a fault of its own.

    Command-line tools print the message on one line and exit with 128 + the signal's
    number (143 for SIGTERM, 130 for SIGINT), the status a process killed by that signal
    reports, so that a restart policy (Kubernetes, Kubeflow's ExitCode, SLURM's requeue)
    restarts it.
    """

    def __init__(self, signal_number, message):
        super().__init__(message)
        self.signal_number = signal_number
        self.exit_status = stopped_exit_status(signal_number)


def stopped_exit_status(signal_number):
    """The exit status of a command stopped by `signal_number`: 128 + its number, what a
    process killed by that signal reports (RunStopped)."""
    return 128 + signal_number
