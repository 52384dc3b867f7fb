"""The cuDNN a process would load, against the one TensorFlow was built for: its version
read through ctypes, which needs no GPU, so that a wrong one is one line before training.

TensorFlow 2.15 opens cuDNN at start-up by dlopen("libcudnn.so.8") (8 is
tf.sysconfig.get_build_info()["cudnn_version"]) from libtensorflow_framework.so.2, and
the dynamic loader looks where it looks for that library: LD_LIBRARY_PATH first, then the
library's RUNPATH, which names the folders of the nvidia-* wheels beside the tensorflow
package (site-packages/nvidia/cudnn/lib, what `pip install 'tensorflow[and-cuda]'`
brings; TensorFlow preloads nothing), then the system's (ld.so.cache, /usr/lib). It
compares the version only at the first convolution, and fails there: "Loaded runtime
CuDNN library: 8.1.0 but source was compiled with: 8.9.4. CuDNN library needs to have
matching major version and equal or higher minor version".
"""

import dataclasses
import os
import re
import subprocess
import sys

from cifar10_estimator.errors import Cifar10EstimatorError

# libtensorflow_framework.so.2's RUNPATH entries for cuDNN, relative to the tensorflow
# package (its $ORIGIN), in their order (tests/test_cuda_libraries.py reads them there).
WHEEL_DIRS_FROM_TENSORFLOW = ("../../nvidia/cudnn/lib", "../nvidia/cudnn/lib")
# The cuDNN wheel of TensorFlow's `and-cuda` extra, in its requirements: the cuDNN it was
# built with ("8.9.4.25"; build_info gives its major version only).
CUDNN_WHEEL_REQUIREMENT = re.compile(r"^nvidia-cudnn-cu\d+\s*\(?\s*==\s*([0-9.]+)")

ON_LD_LIBRARY_PATH = "first on LD_LIBRARY_PATH"
IN_THE_WHEEL = "TensorFlow's nvidia-cudnn wheel"
ON_THE_SYSTEM = "the system's"

# Run by a new interpreter, so that the library it opens does not stay in this process
# (where TensorFlow's own dlopen would be handed it): open the name as dlopen finds it,
# print the version and where the library was found (dladdr).
_READ_CUDNN = r"""
import ctypes, sys
cudnn = ctypes.CDLL(sys.argv[1])
cudnn.cudnnGetVersion.restype = ctypes.c_size_t
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
info = DlInfo()
found = ctypes.CDLL(None).dladdr(ctypes.cast(cudnn.cudnnGetVersion, ctypes.c_void_p),
                                 ctypes.byref(info))
print(cudnn.cudnnGetVersion(), info.fname.decode() if found else sys.argv[1])
"""


@dataclasses.dataclass(frozen=True)
class Cudnn:
    """A cuDNN library: its version (major, minor, patch), its file and how it was found
    (ON_LD_LIBRARY_PATH, IN_THE_WHEEL or ON_THE_SYSTEM)."""

    version: tuple
    path: str
    found: str

    def describe(self):
        """"8.9.4 (/path/libcudnn.so.8, first on LD_LIBRARY_PATH)"."""
        return "%s (%s, %s)" % (version_text(self.version), self.path, self.found)


def version_text(version):
    return ".".join(str(number) for number in version)


def decoded_cudnn_version(number):
    """(major, minor, patch) of cudnnGetVersion()'s number: 8906 is 8.9.6 (cuDNN 8:
    major x 1000 + minor x 100 + patch), 90100 is 9.1.0 (cuDNN 9 on: x 10000)."""
    major_unit = 10000 if number >= 10000 else 1000
    return (number // major_unit, number % major_unit // 100, number % 100)


def built_for_cudnn(build_info, tensorflow_requirements):
    """The cuDNN version TensorFlow was built for: (major, minor) from its `and-cuda`
    extra's cuDNN wheel, else (major,) from its build info; None where it was built
    without CUDA.

    Args:
      build_info: tf.sysconfig.get_build_info().
      tensorflow_requirements: the tensorflow distribution's requirements (strings).
    """
    if not build_info.get("is_cuda_build") or not build_info.get("cudnn_version"):
        return None
    major = int(str(build_info["cudnn_version"]).split(".")[0])
    for requirement in tensorflow_requirements:
        match = CUDNN_WHEEL_REQUIREMENT.match(requirement)
        if match and int(match.group(1).split(".")[0]) == major:
            return tuple(int(number) for number in match.group(1).split(".")[:2])
    return (major,)


def cudnn_soname(built_for):
    """The name TensorFlow dlopens cuDNN by: libcudnn.so.<major>."""
    return "libcudnn.so.%d" % built_for[0]


def wheel_dirs(tensorflow_dir):
    """The folders libtensorflow_framework.so.2's RUNPATH names for cuDNN's wheel."""
    return [os.path.normpath(os.path.join(tensorflow_dir, relative))
            for relative in WHEEL_DIRS_FROM_TENSORFLOW]


def loadable_cudnn(soname, tensorflow_wheel_dirs, ld_library_path):
    """The Cudnn that dlopen(soname) from TensorFlow would open, or None where there is
    none (or it cannot be opened: TensorFlow then sees no GPU and says why).

    A new interpreter opens it with the wheel's folders after LD_LIBRARY_PATH, where
    TensorFlow's RUNPATH puts them, so that the loader finds it as TensorFlow's would.
    """
    user_dirs = [directory for directory in (ld_library_path or "").split(os.pathsep)
                 if directory]
    environment = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
        user_dirs + list(tensorflow_wheel_dirs)))
    try:
        child = subprocess.run([sys.executable, "-c", _READ_CUDNN, soname], env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               universal_newlines=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    number, _, path = child.stdout.strip().partition(" ")
    if child.returncode != 0 or not number.isdigit():
        return None
    return Cudnn(decoded_cudnn_version(int(number)), path,
                 _how_found(path, user_dirs, tensorflow_wheel_dirs))


def _how_found(path, user_dirs, tensorflow_wheel_dirs):
    folder = os.path.realpath(os.path.dirname(path))
    if any(folder == os.path.realpath(directory) for directory in user_dirs):
        return ON_LD_LIBRARY_PATH
    if any(folder == os.path.realpath(directory) for directory in tensorflow_wheel_dirs):
        return IN_THE_WHEEL
    return ON_THE_SYSTEM


def serves(built_for, version):
    """Whether TensorFlow built for cuDNN `built_for` runs with cuDNN `version`: the same
    major version and an equal or higher minor one (its own rule; patches do not count)."""
    return version[0] == built_for[0] and version[1:2] >= built_for[1:2]


def mismatch_text(built_for, cudnn):
    """The one line for TensorFlow built for cuDNN `built_for` that would load `cudnn`,
    a Cudnn it does not serve: what, where, and the fix."""
    wanted = version_text(built_for)
    if cudnn.found == ON_LD_LIBRARY_PATH:
        fix = ("take %s off LD_LIBRARY_PATH, or put a cuDNN %s before it there"
               % (os.path.dirname(cudnn.path), _served_range(built_for)))
    else:
        fix = ("pip install -e '.[gpu]' installs the cuDNN %s wheel, which TensorFlow loads "
               "before the system's" % wanted)
    return ("the cuDNN this process would load is %s, but TensorFlow was built for cuDNN "
            "%s and would fail at its first convolution (it needs the same major version "
            "and an equal or higher minor one); %s; --num-gpus 0 trains on the CPU"
            % (cudnn.describe(), wanted, fix))


def _served_range(built_for):
    """"8.9 or a later 8.x" (or "8.x" where the minor version is unknown)."""
    if len(built_for) == 1:
        return "%d.x" % built_for[0]
    return "%s or a later %d.x" % (version_text(built_for), built_for[0])


def tensorflow_cudnn():
    """(built_for, Cudnn or None) of this machine's TensorFlow: the cuDNN it was built for
    (built_for_cudnn) and the one it would load; built_for None without CUDA."""
    from importlib import metadata
    import tensorflow as tf  # lazy: keeps the trainer's flag errors fast
    try:
        requirements = metadata.requires("tensorflow") or []
    except metadata.PackageNotFoundError:
        requirements = []
    built_for = built_for_cudnn(tf.sysconfig.get_build_info(), requirements)
    if built_for is None:
        return None, None
    return built_for, loadable_cudnn(cudnn_soname(built_for),
                                     wheel_dirs(tf.sysconfig.get_lib()),
                                     os.environ.get("LD_LIBRARY_PATH"))


def check_cudnn():
    """Raises Cifar10EstimatorError where the cuDNN TensorFlow would load is not one it
    runs with (mismatch_text); says nothing where it would load none."""
    built_for, cudnn = tensorflow_cudnn()
    if cudnn is not None and not serves(built_for, cudnn.version):
        raise Cifar10EstimatorError(mismatch_text(built_for, cudnn))
