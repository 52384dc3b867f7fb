"""Directories that session fixtures build once for the whole test run, whichever of the
parallel test processes (pytest-xdist workers) asks first."""

import fcntl
import os
import shutil

def run_temp_dir(tmp_path_factory):
    """The temporary directory of this test run, shared by all its workers.

    Each xdist worker has a base temp of its own (.../pytest-N/popen-gwK); their parent
    belongs to this run alone. Without workers it is the session's base temp.
    """
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory, name, build):
    """run_temp_dir()/name, made by build(path) the first time any worker asks for it.

    A worker that asks while another builds it waits for it (an exclusive file lock);
    a build that failed is cleared and tried again by the next one to ask, which so
    reports the failure too.
    """
    root = run_temp_dir(tmp_path_factory)
    path, built = root / name, root / (name + ".built")
    with open(str(root / (name + ".lock")), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            if path.exists():
                shutil.rmtree(str(path))
            path.mkdir()
            build(path)
            built.write_text("")
    return path
