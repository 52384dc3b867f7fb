"""Stand-in programs for the machines the tests are not on: an NVIDIA driver listing two
GPUs (or N), a PATH with no Python 3.9-3.11 but a python3 3.13, a cuDNN library of any
version."""

import os
import shutil
import subprocess

import pytest

# What `nvidia-smi -L` prints on a box of two GPUs.
TWO_GPUS = ("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5e2f8c1a-0d6b-4c9e-9a43-1f0e2b7c9d11)\n"
            "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-8b31d7e4-22f0-4a5c-b6d8-3c9a4e1f7a02)\n")


def write_program(path, script):
    path.write_text(script)
    path.chmod(0o755)
    return path


def gpu_listing(num_gpus):
    """What `nvidia-smi -L` prints on a box of num_gpus A100s (TWO_GPUS for two)."""
    if num_gpus == 2:
        return TWO_GPUS
    return "".join("GPU %d: NVIDIA A100-SXM4-80GB (UUID: GPU-%08x-0d6b-4c9e-9a43-1f0e2b7c9d11)\n"
                   % (index, index) for index in range(num_gpus))


def nvidia_smi_dir(directory, listing=TWO_GPUS):
    """`directory`, holding an nvidia-smi that lists `listing` (gpu_listing), to put first
    on PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    write_program(directory / "nvidia-smi",
                  '#!/bin/sh\n[ "$1" = -L ] || exit 6\nprintf "%s"\n' % listing)
    return directory


def path_without_python(directory, python3_version="3.13.1"):
    """A PATH of every program in /usr/bin and /bin but Python, pip, uv, curl, wget and
    nvidia-smi, after a directory (`stand-ins`) holding a python3 that says it is
    `python3_version` and runs nothing."""
    tools, stand_ins = directory / "tools", directory / "stand-ins"
    tools.mkdir(parents=True)
    stand_ins.mkdir()
    for system_dir in ("/usr/bin", "/bin"):
        for name in sorted(os.listdir(system_dir)):
            if (name.startswith(("python", "pip", "uv")) or name in ("curl", "wget", "nvidia-smi")
                    or (tools / name).exists()):
                continue
            os.symlink(os.path.join(system_dir, name), str(tools / name))
    write_program(stand_ins / "python3", '#!/bin/sh\n[ "$1" = --version ] && '
                  'echo "Python %s" && exit 0\nexit 1\n' % python3_version)
    return str(stand_ins) + os.pathsep + str(tools)


def cudnn_dir(directory, version_number):
    """`directory`, holding a libcudnn.so.8 (compiled here with gcc) whose cudnnGetVersion()
    returns `version_number` (8100 for 8.1.0) and which does nothing else: a cuDNN to put
    first on LD_LIBRARY_PATH."""
    if shutil.which("gcc") is None:
        pytest.skip("the stand-in cuDNN is compiled with gcc, which is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "cudnn.c"
    source.write_text("#include <stddef.h>\nsize_t cudnnGetVersion(void) { return %d; }\n"
                      % version_number)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcudnn.so.8", "-o",
                    str(directory / "libcudnn.so.8"), str(source)], check=True, timeout=120)
    return directory
