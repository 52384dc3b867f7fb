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
import os
import re
import struct
import sys

Library = collections.namedtuple("Library", "name wheel loader read_version")


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
LIBRARIES = (
    Library("cudart", "nvidia-cuda-runtime-cu12", "GetCudaRuntimeDsoHandle", runtime_version),
    Library("cublas", "nvidia-cublas-cu12", "GetCublasDsoHandle",
            property_version("cublasGetProperty")),
    Library("cublasLt", "nvidia-cublas-cu12", "GetCublasLtDsoHandle", cublaslt_version),
    Library("cufft", "nvidia-cufft-cu12", "GetCufftDsoHandle",
            property_version("cufftGetProperty")),
    Library("curand", "nvidia-curand-cu12", None, property_version("curandGetProperty")),
    Library("cusolver", "nvidia-cusolver-cu12", "GetCusolverDsoHandle",
            property_version("cusolverGetProperty")),
    Library("cusparse", "nvidia-cusparse-cu12", "GetCusparseDsoHandle",
            property_version("cusparseGetProperty")),
    Library("cudnn", "nvidia-cudnn-cu12", "GetCudnnDsoHandle", cudnn_version),
    Library("nccl", "nvidia-nccl-cu12", "GetNcclDsoHandle", nccl_version),
)
# The driver's library: the host's, given to a container by the NVIDIA runtime.
DRIVER = Library("cuda", None, "GetCudaDriverDsoHandle", driver_version)


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
        pinned = re.match(r"([\w.-]+)\s*==\s*([\w.]+)\s*;.*extra\s*==\s*.and-cuda.", requirement)
        if pinned:
            pins[pinned.group(1).lower()] = pinned.group(2)
    return pins


def installed_version(wheel):
    try:
        return importlib.metadata.version(wheel)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_problems(library, version, pins, build_info):
    """What disagrees between a library's version, its wheel's, TensorFlow's pin and build."""
    installed = installed_version(library.wheel)
    pin = pins.get(library.wheel)
    problems = []
    if version is None:
        problems.append("it gives no version")
    elif installed and (installed + ".").startswith(version + ".") is False:
        problems.append("version %s, but its wheel is %s %s" % (version, library.wheel, installed))
    if pin is None:
        problems.append("TensorFlow pins no %s" % library.wheel)
    elif installed != pin:
        problems.append("%s %s installed, TensorFlow pins %s" % (library.wheel, installed, pin))
    built_for = {"cudart": build_info.get("cuda_version"),
                 "cudnn": build_info.get("cudnn_version")}.get(library.name)
    if version and built_for and not (version + ".").startswith(built_for + "."):
        problems.append("TensorFlow was built for %s %s" % (library.name, built_for))
    return problems


def open_library(library, tensorflow_cc):
    """(path, how it was found) of a library, or (None, why not)."""
    if library.loader:
        path = open_with_tensorflow(tensorflow_cc, library.loader)
        if path:
            return path, "TensorFlow's loader"
    path = wheel_file(library)
    if path is None:
        return None, "missing: TensorFlow's loader cannot open it, and %s is not installed" % (
            library.wheel)
    try:
        ctypes.CDLL(path)
    except OSError as error:
        return None, "cannot be opened: %s" % error
    if library.loader:
        return path, "its wheel's directory, which TensorFlow's loader does not search"
    return path, "its wheel's directory (TensorFlow has no loader for it)"


def check(library, tensorflow_cc, pins, build_info):
    """(one line about a library, whether it is fine)."""
    path, how = open_library(library, tensorflow_cc)
    if path is None:
        return "%-9s %s" % (library.name, how), False
    version = library.read_version(ctypes.CDLL(path))
    problems = version_problems(library, version, pins, build_info)
    line = "%-9s %-18s %-8s %s %s, opened by %s: %s" % (
        library.name, os.path.basename(path), version, library.wheel,
        installed_version(library.wheel), how, path)
    return line + "".join("\n          PROBLEM: " + problem for problem in problems), not problems


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's own lines say less
    import tensorflow as tf

    build_info = tf.sysconfig.get_build_info()
    print("TensorFlow %s, built for CUDA %s and cuDNN %s (tf.sysconfig.get_build_info())"
          % (tf.__version__, build_info.get("cuda_version"), build_info.get("cudnn_version")))
    tensorflow_cc = ctypes.CDLL(os.path.join(os.path.dirname(tf.__file__),
                                             "libtensorflow_cc.so.2"))
    pins = tensorflow_pins()
    fine = True
    for library in LIBRARIES:
        line, library_fine = check(library, tensorflow_cc, pins, build_info)
        print(line)
        fine = fine and library_fine
    driver = open_with_tensorflow(tensorflow_cc, DRIVER.loader)
    if driver:
        print("%-9s %-18s %-8s the driver's, opened by TensorFlow's loader: %s" % (
            DRIVER.name, os.path.basename(driver), DRIVER.read_version(ctypes.CDLL(driver)),
            driver))
    else:
        print("%-9s missing: libcuda.so.1, the NVIDIA driver's, comes from the host at run time "
              "(docker run --gpus all, podman run --device nvidia.com/gpu=all)" % DRIVER.name)
    print("every CUDA library TensorFlow opens is here and agrees" if fine else
          "not every CUDA library TensorFlow opens is here and agrees (PROBLEM and missing "
          "lines above); the GPU image (--build-arg EXTRAS=gpu) has them")
    return 0 if fine else 1


if __name__ == "__main__":
    sys.exit(main())
