"""The CUDA libraries TensorFlow opens, their versions read through ctypes (no GPU needed)
against those it was built for and those its `and-cuda` extra pins: two checks.

The trainer's, check_cudnn(), before it trains on GPUs (flags.validate): TensorFlow 2.15
opens cuDNN at start-up by dlopen("libcudnn.so.8") (8 is
tf.sysconfig.get_build_info()["cudnn_version"]) from libtensorflow_framework.so.2, and
the dynamic loader looks where it looks for that library: LD_LIBRARY_PATH first, then the
library's RUNPATH, which names the folders of the nvidia-* wheels beside the tensorflow
package (site-packages/nvidia/cudnn/lib, what `pip install 'tensorflow[and-cuda]'`
brings; TensorFlow preloads nothing), then the system's (ld.so.cache, /usr/lib). It
compares the version only at the first convolution, and fails there: "Loaded runtime
CuDNN library: 8.1.0 but source was compiled with: 8.9.4. CuDNN library needs to have
matching major version and equal or higher minor version". So a wrong one is one line
before training.

The image's, every library TensorFlow opens (`cifar10-cuda-libraries`, in the GPU image):

    python -m cifar10_estimator.machine.cuda_libraries
    docker run --rm --entrypoint cifar10-cuda-libraries cifar10-estimator:gpu

Without a driver TensorFlow stops at libcuda.so.1 before it opens the rest, so nothing it
prints shows whether it would find its CUDA wheels. This asks TensorFlow's own library
loader (tsl::internal::DsoLoader, the functions its GPU plugins call) to open each library:
the names and the directories searched are TensorFlow's (the wheels' directories are in
the RUNPATH of libtensorflow_cc.so.2). A library TensorFlow has no loader for, or whose
directory it does not search, is opened from its wheel's directory instead, and the line
says so. Each library's version, as it reports it without a GPU, is held against the
wheel's version, TensorFlow's pin of that wheel and what TensorFlow was built with. Exit
status 0 when every library opens and agrees, whether or not the driver is there (the
host gives libcuda.so.1 at run time); 1 otherwise, each problem on its line.
"""

import collections
import ctypes
import dataclasses
import importlib.metadata
import mmap
import os
import re
import struct
import subprocess
import sys

from cifar10_estimator.cli.child_process import child_environment
from cifar10_estimator.cli.command import run_command
from cifar10_estimator.cli.options import ArgumentParser
from cifar10_estimator.cli.tensorflow_logs import quiet_tensorflow_logs
from cifar10_estimator.errors import Cifar10EstimatorError


def version_text(version):
    """'8.9.4' of (8, 9, 4)."""
    return ".".join(str(number) for number in version)


def _shown(version):
    """version_text of a version a report prints, 'none' of None."""
    return version_text(version) if version else "none"


def parsed_version(text):
    """(12, 2, 140) of '12.2.140' (its leading numbers: (2, 15, 0) of '2.15.0.post1');
    None of None or of text that starts with no number."""
    match = re.match(r"\d+(?:\.\d+)*", text or "")
    return tuple(int(number) for number in match.group().split(".")) if match else None


def decoded_version_number(number):
    """(major, minor, patch) of a version number as cuDNN, NCCL and cuBLASLt give it: 8906
    is 8.9.6 (major x 1000 + minor x 100 + patch: cuDNN 8, NCCL before 2.9), 90100 is
    9.1.0 and 21605 is 2.16.5 (major x 10000: cuDNN 9 and NCCL 2.9 on, cuBLASLt)."""
    major_unit = 10000 if number >= 10000 else 1000
    return (number // major_unit, number % major_unit // 100, number % 100)


def _int_out(function, *arguments):
    """The int a CUDA-style `status function(..., int *value)` gives; None where its status
    is not 0."""
    value = ctypes.c_int()
    function.restype = ctypes.c_int
    return value.value if function(*arguments, ctypes.byref(value)) == 0 else None


def _cuda_version(number):
    """(major, minor) of CUDA's version number: 12020 is 12.2."""
    return None if number is None else (number // 1000, number % 1000 // 10)


def runtime_version(library):
    return _cuda_version(_int_out(library.cudaRuntimeGetVersion))


def driver_version(library):
    return _cuda_version(_int_out(library.cuDriverGetVersion))


def property_version(function_name):
    """A reader of (major, minor, patch) through `status function(libraryPropertyType,
    int *)`."""
    def read(library):
        # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        parts = tuple(_int_out(getattr(library, function_name), property_type)
                      for property_type in range(3))
        return None if None in parts else parts
    return read


def size_t_version(function_name):
    """A reader of (major, minor, patch) through `size_t function(void)`'s version number
    (decoded_version_number)."""
    def read(library):
        function = getattr(library, function_name)
        function.restype = ctypes.c_size_t
        return decoded_version_number(function())
    return read


def nccl_version(library):
    number = _int_out(library.ncclGetVersion)
    return None if number is None else decoded_version_number(number)


Library = collections.namedtuple("Library", "name wheel loader read_version elsewhere")
Library.__doc__ = """One CUDA library.

Attributes:
  name: its name in lib<name>.so.<major>.
  wheel: the distribution that brings it.
  loader: the function of tsl::internal::DsoLoader that opens it, or None.
  read_version: library (a ctypes.CDLL) -> its version, (major, minor[, patch]), or None.
  elsewhere: why it may be opened from its wheel's directory when TensorFlow's loader does
    not open it; None where that would be a fault.
"""

CUDNN = Library("cudnn", "nvidia-cudnn-cu12", "GetCudnnDsoHandle",
                size_t_version("cudnnGetVersion"), None)
# What TensorFlow 2.15's CUDA build opens, each with its wheel (TensorFlow's and-cuda pins
# them) and the loader function of tsl::internal::DsoLoader that opens it (None: it has none).
# A library comes before those that need it (cuBLAS needs cuBLASLt, cuSOLVER cuSPARSE), so
# that TensorFlow's loader finds each itself, not as one already loaded for another.
LIBRARIES = (
    Library("cudart", "nvidia-cuda-runtime-cu12", "GetCudaRuntimeDsoHandle", runtime_version,
            None),
    Library("cublasLt", "nvidia-cublas-cu12", "GetCublasLtDsoHandle",
            size_t_version("cublasLtGetVersion"), None),
    Library("cublas", "nvidia-cublas-cu12", "GetCublasDsoHandle",
            property_version("cublasGetProperty"), None),
    Library("cufft", "nvidia-cufft-cu12", "GetCufftDsoHandle",
            property_version("cufftGetProperty"), None),
    Library("curand", "nvidia-curand-cu12", None, property_version("curandGetProperty"),
            "TensorFlow 2.15 has no loader for cuRAND"),
    Library("cusparse", "nvidia-cusparse-cu12", "GetCusparseDsoHandle",
            property_version("cusparseGetProperty"), None),
    Library("cusolver", "nvidia-cusolver-cu12", "GetCusolverDsoHandle",
            property_version("cusolverGetProperty"), None),
    CUDNN,
    Library("nccl", "nvidia-nccl-cu12", "GetNcclDsoHandle", nccl_version,
            "TensorFlow 2.15 carries its own NCCL, compiled in, and its loader does not "
            "search the wheel's directory"),
)
# The driver's library: the host's, given to a container by the NVIDIA runtime.
DRIVER = Library("cuda", None, "GetCudaDriverDsoHandle", driver_version, None)


class _LinkMap(ctypes.Structure):
    """The public head of glibc's struct link_map (<link.h>); a dlopen handle points at one."""


_LinkMap._fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p),
                     ("l_ld", ctypes.c_void_p), ("l_next", ctypes.POINTER(_LinkMap)),
                     ("l_prev", ctypes.POINTER(_LinkMap))]


def loaded_objects():
    """{dlopen handle: path} of every shared object this process has loaded."""
    found = {}
    entry = ctypes.cast(ctypes.CDLL(None)._handle, ctypes.POINTER(_LinkMap))
    while entry:
        found[ctypes.addressof(entry.contents)] = (entry.contents.l_name or b"").decode()
        entry = entry.contents.l_next
    return found


def library_path(library):
    """The file of an opened library (a ctypes.CDLL), as the dynamic loader found it."""
    return loaded_objects()[library._handle]


# A wheel TensorFlow's `and-cuda` extra pins, in its requirements:
# "nvidia-cudnn-cu12 (==8.9.4.25) ; extra == 'and-cuda'".
AND_CUDA_PIN = re.compile(r"([\w.-]+)\s*\(?==\s*([\w.]+)\)?\s*;.*extra\s*==\s*.and-cuda.")


def and_cuda_pins(requirements):
    """{wheel: version} that TensorFlow's and-cuda extra pins, of its requirements (strings)."""
    pins = {}
    for requirement in requirements:
        pinned = AND_CUDA_PIN.match(requirement)
        if pinned:
            pins[pinned.group(1).lower()] = pinned.group(2)
    return pins


@dataclasses.dataclass(frozen=True)
class TensorFlowBuild:
    """What this machine's TensorFlow says of itself.

    Attributes:
      version: tf.__version__.
      build_info: tf.sysconfig.get_build_info(): CUDA's and cuDNN's versions among others.
      lib_dir: the tensorflow package's folder (tf.sysconfig.get_lib()), its libraries'.
      pins: {wheel: version} its and-cuda extra pins (and_cuda_pins).
    """

    version: str
    build_info: dict
    lib_dir: str
    pins: dict


def tensorflow_build():
    """The TensorFlowBuild of this machine's TensorFlow (which it imports)."""
    import tensorflow as tf  # lazy: keeps the trainer's flag errors fast
    try:
        requirements = importlib.metadata.requires("tensorflow") or []
    except importlib.metadata.PackageNotFoundError:
        requirements = []
    return TensorFlowBuild(tf.version.VERSION, dict(tf.sysconfig.get_build_info()),
                           tf.sysconfig.get_lib(), and_cuda_pins(requirements))


def built_for_cudnn(build_info, pins):
    """The cuDNN version TensorFlow was built for: (major, minor) from the cuDNN wheel its
    `and-cuda` extra pins, else (major,) from its build info; None where it was built
    without CUDA.

    Args:
      build_info: tf.sysconfig.get_build_info().
      pins: {wheel: version} of its and-cuda extra (and_cuda_pins).
    """
    if not build_info.get("is_cuda_build") or not build_info.get("cudnn_version"):
        return None
    major = parsed_version(str(build_info["cudnn_version"]))[0]
    pinned = parsed_version(pins.get(CUDNN.wheel))
    return pinned[:2] if pinned and pinned[0] == major else (major,)


def serves(built_for, version):
    """Whether TensorFlow built for cuDNN `built_for` runs with cuDNN `version`: the same
    major version and an equal or higher minor one (its own rule; patches do not count)."""
    return version[0] == built_for[0] and version[1:2] >= built_for[1:2]


def leads(version, longer):
    """Whether `version`'s numbers begin `longer`'s: (12, 2) leads (12, 2, 140), not (12, 20)."""
    return tuple(longer[:len(version)]) == tuple(version)


# libtensorflow_framework.so.2's RUNPATH entries for cuDNN, relative to the tensorflow
# package (its $ORIGIN), in their order (tests/test_cuda_libraries.py reads them there).
WHEEL_DIRS_FROM_TENSORFLOW = ("../../nvidia/cudnn/lib", "../nvidia/cudnn/lib")

ON_LD_LIBRARY_PATH = "first on LD_LIBRARY_PATH"
IN_THE_WHEEL = "TensorFlow's nvidia-cudnn wheel"
ON_THE_SYSTEM = "the system's"

# Run by a new interpreter, so that the library it opens does not stay in this process
# (where TensorFlow's own dlopen would be handed it).
_PRINT_OPENED_CUDNN = ("import sys; from cifar10_estimator.machine import cuda_libraries; "
                       "cuda_libraries.print_opened_cudnn(sys.argv[1])")


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


def cudnn_soname(built_for):
    """The name TensorFlow dlopens cuDNN by: libcudnn.so.<major>."""
    return "libcudnn.so.%d" % built_for[0]


def wheel_dirs(tensorflow_dir):
    """The folders libtensorflow_framework.so.2's RUNPATH names for cuDNN's wheel."""
    return [os.path.normpath(os.path.join(tensorflow_dir, relative))
            for relative in WHEEL_DIRS_FROM_TENSORFLOW]


def print_opened_cudnn(soname):
    """Print the version and the file of the cuDNN dlopen(soname) opens, '8.9.4
    /path/libcudnn.so.8' (loadable_cudnn's new interpreter runs it)."""
    library = ctypes.CDLL(soname)
    print(version_text(CUDNN.read_version(library)), library_path(library))


def loadable_cudnn(soname, tensorflow_wheel_dirs, ld_library_path):
    """The Cudnn that dlopen(soname) from TensorFlow would open, or None where there is
    none (or it cannot be opened: TensorFlow then sees no GPU and says why).

    A new interpreter opens it with the wheel's folders after LD_LIBRARY_PATH, where
    TensorFlow's RUNPATH puts them, so that the loader finds it as TensorFlow's would.
    """
    user_dirs = [directory for directory in (ld_library_path or "").split(os.pathsep)
                 if directory]
    environment = child_environment(
        {"LD_LIBRARY_PATH": os.pathsep.join(user_dirs + list(tensorflow_wheel_dirs))})
    try:
        child = subprocess.run([sys.executable, "-c", _PRINT_OPENED_CUDNN, soname],
                               env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, universal_newlines=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    version, _, path = child.stdout.strip().partition(" ")
    if child.returncode != 0 or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        return None
    return Cudnn(parsed_version(version), path,
                 _how_found(path, user_dirs, tensorflow_wheel_dirs))


def _how_found(path, user_dirs, tensorflow_wheel_dirs):
    folder = os.path.realpath(os.path.dirname(path))
    if any(folder == os.path.realpath(directory) for directory in user_dirs):
        return ON_LD_LIBRARY_PATH
    if any(folder == os.path.realpath(directory) for directory in tensorflow_wheel_dirs):
        return IN_THE_WHEEL
    return ON_THE_SYSTEM


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


def tensorflow_cudnn(build):
    """(built_for, Cudnn or None) of TensorFlow `build` (a TensorFlowBuild): the cuDNN it
    was built for (built_for_cudnn) and the one it would load; built_for None without
    CUDA."""
    built_for = built_for_cudnn(build.build_info, build.pins)
    if built_for is None:
        return None, None
    return built_for, loadable_cudnn(cudnn_soname(built_for), wheel_dirs(build.lib_dir),
                                     os.environ.get("LD_LIBRARY_PATH"))


def check_cudnn():
    """Raises Cifar10EstimatorError where the cuDNN TensorFlow would load is not one it
    runs with (mismatch_text); says nothing where it would load none."""
    built_for, cudnn = tensorflow_cudnn(tensorflow_build())
    if cudnn is not None and not serves(built_for, cudnn.version):
        raise Cifar10EstimatorError(mismatch_text(built_for, cudnn))


TENSORFLOW_CC = "libtensorflow_cc.so.2"
# How libtensorflow_cc.so.2 names the NCCL compiled into it.
BUILT_IN_NCCL = re.compile(rb"NCCL version (\d+\.\d+\.\d+)\+cuda")

Expected = collections.namedtuple("Expected", "version where runs_with")
Expected.__doc__ = """What TensorFlow expects of a library.

Attributes:
  version: the version it was built with (or for), or None where it names none.
  where: where it says so.
  runs_with: (version, the library's version) -> whether it runs with that library.
"""


def open_with_tensorflow(tensorflow_cc, loader):
    """Path of the library TensorFlow's loader function opens, or None if it cannot.

    The function returns absl::StatusOr<void*>, through a pointer to memory the caller
    gives (the C++ ABI's way for a class with a destructor): the status, then the handle.
    Rather than read absl's status, the handle is known by being one of the process's
    loaded objects.
    """
    function = getattr(tensorflow_cc, "_ZN3tsl8internal9DsoLoader%d%sEv" % (len(loader), loader))
    function.argtypes, function.restype = [ctypes.c_void_p], ctypes.c_void_p
    result = ctypes.create_string_buffer(64)
    function(result)
    loaded = loaded_objects()
    handles = [word for word in struct.unpack("2Q", result.raw[:16]) if word in loaded]
    return loaded[handles[0]] if handles else None


def wheel_file(library):
    """Path of lib<name>.so.<major> in the library's wheel, or None if it is not installed."""
    try:
        files = importlib.metadata.files(library.wheel) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    pattern = re.compile(r"lib%s\.so\.\d+$" % re.escape(library.name))
    paths = [str(entry.locate()) for entry in files if pattern.match(entry.name)]
    return paths[0] if paths else None


def installed_version(wheel):
    try:
        return importlib.metadata.version(wheel)
    except importlib.metadata.PackageNotFoundError:
        return None


def built_in_nccl_version(tensorflow_cc_path):
    """The version of the NCCL compiled into libtensorflow_cc.so.2, or None."""
    with open(tensorflow_cc_path, "rb") as stream:
        with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as contents:
            found = BUILT_IN_NCCL.search(contents)
            return parsed_version(found.group(1).decode()) if found else None


def tensorflow_expects(build):
    """{library name: Expected} of the libraries TensorFlow `build` names a version of."""
    info = "tf.sysconfig.get_build_info()"
    return {
        "cudart": Expected(parsed_version(build.build_info.get("cuda_version")), info, leads),
        # The trainer's check (check_cudnn), TensorFlow's own rule.
        "cudnn": Expected(built_for_cudnn(build.build_info, build.pins),
                          "%s and its pin of %s" % (info, CUDNN.wheel), serves),
        "nccl": Expected(built_in_nccl_version(os.path.join(build.lib_dir, TENSORFLOW_CC)),
                         "its NCCL, compiled in", leads)}


def version_problems(library, version, installed, pins, expects):
    """What disagrees between a library's version, its wheel's, TensorFlow's pin and build.

    Args:
      library: a Library.
      version: the version it gives, or None.
      installed: its wheel's installed version (text), or None.
      pins: {wheel: version} of TensorFlow's and-cuda extra.
      expects: {library name: Expected} (tensorflow_expects).
    """
    pin = pins.get(library.wheel)
    problems = []
    if version is None:
        problems.append("it gives no version")
    elif installed and not leads(version, parsed_version(installed)):
        problems.append("version %s, but its wheel is %s %s"
                        % (version_text(version), library.wheel, installed))
    if pin != installed:
        problems.append("%s %s installed, TensorFlow pins %s"
                        % (library.wheel, installed or "not", pin))
    expected = expects.get(library.name)
    if expected is not None:
        if expected.version is None:
            problems.append("TensorFlow names no version of it (%s)" % expected.where)
        elif version and not expected.runs_with(expected.version, version):
            problems.append("TensorFlow was built with %s %s (%s)" % (
                library.name, version_text(expected.version), expected.where))
    return problems


def open_library(library, tensorflow_cc):
    """(path, how it came to be opened there or None) of a library; (None, why) if it is not."""
    if library.loader:
        path = open_with_tensorflow(tensorflow_cc, library.loader)
        if path:
            return os.path.normpath(path), None
    path = wheel_file(library)
    if path is None:
        return None, "missing: TensorFlow's loader cannot open it, and %s is not installed" % (
            library.wheel)
    try:
        ctypes.CDLL(path)
    except OSError as error:
        return None, "missing: TensorFlow's loader cannot open it, nor can its wheel's " \
                     "file be opened: %s" % error
    if library.elsewhere is None:
        return None, ("missing: TensorFlow's loader cannot open it, though its wheel's file "
                      "opens by its path, %s" % path)
    return path, "opened from its wheel's directory: %s" % library.elsewhere


def check(library, tensorflow_cc, pins, expects):
    """(what to print about a library, whether it is fine)."""
    path, how = open_library(library, tensorflow_cc)
    if path is None:
        return "%-9s %s" % (library.name, how), False
    version = library.read_version(ctypes.CDLL(path))
    installed = installed_version(library.wheel)
    problems = version_problems(library, version, installed, pins, expects)
    lines = ["%-9s %-18s %-7s %s==%s  %s" % (
        library.name, os.path.basename(path), _shown(version), library.wheel, installed,
        path)]
    lines += ["          (%s)" % how] if how else []
    lines += ["          PROBLEM: %s" % problem for problem in problems]
    return "\n".join(lines), not problems


def driver_line(tensorflow_cc):
    path = open_with_tensorflow(tensorflow_cc, DRIVER.loader)
    if path is None:
        return ("%-9s missing: libcuda.so.1, the NVIDIA driver's, comes from the host at run "
                "time (docker run --gpus all, podman run --device nvidia.com/gpu=all)"
                % DRIVER.name)
    version = DRIVER.read_version(ctypes.CDLL(path))
    return "%-9s %-18s %-7s the NVIDIA driver's  %s" % (
        DRIVER.name, os.path.basename(path), _shown(version), path)


def build_parser():
    return ArgumentParser(
        description="Which CUDA libraries TensorFlow opens here, from where, and whether "
                    "their versions agree with their wheels, TensorFlow's pins of them and "
                    "what TensorFlow was built with; no GPU needed. Exit status 0 when every "
                    "one opens and agrees (the NVIDIA driver's aside), else 1.")


def main(argv):
    build_parser().parse_args(argv)
    quiet_tensorflow_logs("3", "ERROR")
    build = tensorflow_build()
    expects = tensorflow_expects(build)
    print("TensorFlow %s, built with CUDA %s and cuDNN %s (%s); each library opened by "
          "TensorFlow's own loader unless its line says otherwise"
          % (build.version, _shown(expects["cudart"].version),
             _shown(expects["cudnn"].version), expects["cudnn"].where))
    tensorflow_cc = ctypes.CDLL(os.path.join(build.lib_dir, TENSORFLOW_CC))
    fine = True
    for library in LIBRARIES:
        text, library_fine = check(library, tensorflow_cc, build.pins, expects)
        print(text)
        fine = fine and library_fine
    print(driver_line(tensorflow_cc))
    if fine:
        print("every CUDA library TensorFlow opens is here, each of the version its wheel, "
              "TensorFlow's pin of that wheel and TensorFlow's build name")
        return 0
    print("not every CUDA library TensorFlow opens is here, or of the version it needs "
          "(the lines above); the GPU image, --build-arg EXTRAS=gpu, has them")
    return 1


def console_main():
    sys.exit(run_command(main))


if __name__ == "__main__":
    console_main()
