#!/usr/bin/env python3
"""Which CUDA libraries TensorFlow opens here, from where, and whether their versions agree.

Installed in the image as `cifar10-cuda-libraries`:

    docker run --rm --entrypoint cifar10-cuda-libraries cifar10-estimator:gpu
    docker run --rm --gpus all --entrypoint cifar10-cuda-libraries cifar10-estimator:gpu

Without a driver TensorFlow stops at libcuda.so.1 before it opens the rest, so nothing it
prints shows whether it would find its CUDA wheels. This asks TensorFlow's own library
loader (tsl::internal::DsoLoader, the functions its GPU plugins call) to open each library:
the names and the directories searched are TensorFlow's (the wheels' directories are in
the RUNPATH of libtensorflow_cc.so.2). A library TensorFlow has no loader for, or whose
directory it does not search, is opened from its wheel's directory instead, and the line
says so. Each library's version, as it reports it without a GPU, is held against the
wheel's version, TensorFlow's pin of that wheel (its and-cuda extra) and
tf.sysconfig.get_build_info().

Exit status 0 when every library opens and agrees, whether or not the driver is there
(the host gives libcuda.so.1 at run time); 1 otherwise, each problem on its line.
"""

import collections
import ctypes
import importlib.metadata
import mmap
import os
import re
import struct
import sys

Library = collections.namedtuple("Library", "name wheel loader read_version elsewhere")
Library.__doc__ = """One CUDA library.

Attributes:
  name: its name in lib<name>.so.<major>.
  wheel: the distribution that brings it.
  loader: the function of tsl::internal::DsoLoader that opens it, or None.
  read_version: library -> its version, 'major.minor[.patch]'.
  elsewhere: why it may be opened from its wheel's directory when TensorFlow's loader does
    not open it; None where that would be a fault.
"""

def _call_int_out(function):
    """Value of a CUDA-style `status function(int *value)`; None when the status is not 0."""
    value = ctypes.c_int()
    function.restype = ctypes.c_int
    return value.value if function(ctypes.byref(value)) == 0 else None


def _thousands(code):
    """CUDA's version code 12020 as '12.2'."""
    return None if code is None else "%d.%d" % (code // 1000, code % 1000 // 10)


def runtime_version(library):
    return _thousands(_call_int_out(library.cudaRuntimeGetVersion))


def driver_version(library):
    return _thousands(_call_int_out(library.cuDriverGetVersion))


def property_version(function_name):
    """A reader of major.minor.patch through `status function(libraryPropertyType, int *)`."""
    def read(library):
        function = getattr(library, function_name)
        function.restype = ctypes.c_int
        parts = []
        for property_type in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            if function(property_type, ctypes.byref(value)) != 0:
                return None
            parts.append(str(value.value))
        return ".".join(parts)
    return read


def cublaslt_version(library):
    library.cublasLtGetVersion.restype = ctypes.c_size_t
    code = library.cublasLtGetVersion()  # major * 10000 + minor * 100 + patch
    return "%d.%d.%d" % (code // 10000, code % 10000 // 100, code % 100)


def cudnn_version(library):
    library.cudnnGetVersion.restype = ctypes.c_size_t
    code = library.cudnnGetVersion()  # cuDNN 8: major * 1000 + minor * 100 + patch
    return "%d.%d.%d" % (code // 1000, code % 1000 // 100, code % 100)


def nccl_version(library):
    code = _call_int_out(library.ncclGetVersion)  # major * 10000 + minor * 100 + patch
    return None if code is None else "%d.%d.%d" % (code // 10000, code % 10000 // 100,
                                                    code % 100)


# What TensorFlow 2.15's CUDA build opens, each with its wheel (TensorFlow's and-cuda pins
# them) and the loader function of tsl::internal::DsoLoader that opens it (None: it has none).
# A library comes before those that need it (cuBLAS needs cuBLASLt, cuSOLVER cuSPARSE), so
# that TensorFlow's loader finds each itself, not as one already loaded for another.
LIBRARIES = (
    Library("cudart", "nvidia-cuda-runtime-cu12", "GetCudaRuntimeDsoHandle", runtime_version,
            None),
    Library("cublasLt", "nvidia-cublas-cu12", "GetCublasLtDsoHandle", cublaslt_version, None),
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
    Library("cudnn", "nvidia-cudnn-cu12", "GetCudnnDsoHandle", cudnn_version, None),
    Library("nccl", "nvidia-nccl-cu12", "GetNcclDsoHandle", nccl_version,
            "TensorFlow 2.15 carries its own NCCL, compiled in, and its loader does not "
            "search the wheel's directory"),
)
# The driver's library: the host's, given to a container by the NVIDIA runtime.
DRIVER = Library("cuda", None, "GetCudaDriverDsoHandle", driver_version, None)
# How libtensorflow_cc.so.2 names the NCCL compiled into it.
BUILT_IN_NCCL = re.compile(rb"NCCL version (\d+\.\d+\.\d+)\+cuda")


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


def tensorflow_pins():
    """{wheel: version} that TensorFlow's and-cuda extra pins."""
    pins = {}
    for requirement in importlib.metadata.requires("tensorflow") or []:
        pinned = re.match(r"([\w.-]+)\s*\(?==\s*([\w.]+)\)?\s*;.*extra\s*==\s*.and-cuda.",
                          requirement)
        if pinned:
            pins[pinned.group(1).lower()] = pinned.group(2)
    return pins


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
            return found.group(1).decode() if found else None


def tensorflow_expects(build_info, tensorflow_cc_path):
    """{library name: (the version TensorFlow was built with, where it says so)}."""
    build = "tf.sysconfig.get_build_info()"
    return {"cudart": (build_info.get("cuda_version"), build),
            "cudnn": (build_info.get("cudnn_version"), build),
            "nccl": (built_in_nccl_version(tensorflow_cc_path), "its NCCL, compiled in")}


def _leads(version, longer):
    """Whether version's parts lead longer's: '12.2' leads '12.2.140', not '12.20'."""
    return (longer + ".").startswith(version + ".")


def version_problems(library, version, pins, expects):
    """What disagrees between a library's version, its wheel's, TensorFlow's pin and build."""
    installed = installed_version(library.wheel)
    pin = pins.get(library.wheel)
    problems = []
    if version is None:
        problems.append("it gives no version")
    elif not _leads(version, installed):
        problems.append("version %s, but its wheel is %s %s" % (version, library.wheel, installed))
    if pin != installed:
        problems.append("%s %s installed, TensorFlow pins %s" % (library.wheel, installed, pin))
    if library.name in expects:
        built, where = expects[library.name]
        if built is None:
            problems.append("TensorFlow names no version of it (%s)" % where)
        elif version and not _leads(built, version):
            problems.append("TensorFlow was built with %s %s (%s)" % (library.name, built, where))
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
    problems = version_problems(library, version, pins, expects)
    lines = ["%-9s %-18s %-7s %s==%s  %s" % (library.name, os.path.basename(path), version,
                                             library.wheel, installed_version(library.wheel),
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
    return "%-9s %-18s %-7s the NVIDIA driver's  %s" % (
        DRIVER.name, os.path.basename(path), DRIVER.read_version(ctypes.CDLL(path)), path)


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's own lines say less
    import tensorflow as tf

    build_info = tf.sysconfig.get_build_info()
    print("TensorFlow %s, built with CUDA %s and cuDNN %s (tf.sysconfig.get_build_info()); "
          "each library opened by TensorFlow's own loader unless its line says otherwise"
          % (tf.__version__, build_info.get("cuda_version"), build_info.get("cudnn_version")))
    tensorflow_cc_path = os.path.join(os.path.dirname(tf.__file__), "libtensorflow_cc.so.2")
    tensorflow_cc = ctypes.CDLL(tensorflow_cc_path)
    pins, expects = tensorflow_pins(), tensorflow_expects(build_info, tensorflow_cc_path)
    fine = True
    for library in LIBRARIES:
        text, library_fine = check(library, tensorflow_cc, pins, expects)
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


if __name__ == "__main__":
    sys.exit(main())
