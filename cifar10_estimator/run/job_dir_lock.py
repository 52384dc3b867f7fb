"""One trainer per job dir: the process that writes its checkpoints holds it.

Two trainers on one job dir would write checkpoints into each other's history and
exports into each other's directories. The holder keeps an exclusive flock on
job-dir/trainer.lock for as long as it runs, and writes its host and process id there
for the message another trainer gets. The kernel drops the lock when the holder's
process ends in any way, `kill -9` included, so a rerun after a kill takes it at
once: the file stays behind, but a lock nobody holds blocks nothing.
"""

import errno
import fcntl
import json
import os
import socket
import time

from cifar10_estimator import files
from cifar10_estimator.errors import Cifar10EstimatorError

LOCK_FILENAME = "trainer.lock"

# Where flock is not served (some network file systems), the job dir is used unlocked.
_LOCKING_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class JobDirLock:
    """Holds job_dir while the `with` block runs; on object stores (gs://...) nothing is held.

    Raises (on entering):
      Cifar10EstimatorError: another process holds job_dir; the message names its host
        and process id and how to proceed.
    """

    def __init__(self, job_dir):
        self.job_dir = job_dir
        self.path = os.path.join(job_dir, LOCK_FILENAME)
        self._descriptor = None

    def __enter__(self):
        if files.is_url(self.job_dir):  # an object store: no file locks there
            return self
        try:
            os.makedirs(self.job_dir, exist_ok=True)
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            raise Cifar10EstimatorError("cannot write to the job dir %s (%s)"
                                        % (self.job_dir, error.strerror))
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno in _LOCKING_UNSUPPORTED:
                return self
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise Cifar10EstimatorError(self._held_message())
            raise Cifar10EstimatorError("cannot lock %s (%s)" % (self.path, error.strerror))
        self._descriptor = descriptor
        os.ftruncate(descriptor, 0)
        os.write(descriptor, json.dumps({
            "host": socket.gethostname(), "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode() + b"\n")
        return self

    def __exit__(self, *exc_info):
        if self._descriptor is not None:
            os.close(self._descriptor)  # and with it the lock
            self._descriptor = None

    def _held_message(self):
        try:
            with open(self.path) as stream:
                holder = json.load(stream)
            who = "process %s on host %s (since %s)" % (
                holder["pid"], holder["host"], holder["since"])
        except (OSError, ValueError, KeyError, TypeError):
            # The holder takes the lock before it writes its name.
            who = "another process (see %s)" % self.path
        return ("the job dir %s is held by the trainer running as %s; two trainers would "
                "mix their checkpoints: wait for it to end or stop it (a rerun resumes from "
                "its last checkpoint), or pass another --job-dir" % (self.job_dir, who))
