"""Finding and loading libhalo; the C API's constants, prototypes and errors.

Everything here mirrors ffi/include/halo.h; python/tests/test_api.py checks the constants
against the header, so a change there fails a test here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import os
import sys
import threading
from pathlib import Path

__all__ = [
    "Result",
    "DataType",
    "ReduceOp",
    "MoeMode",
    "HaloError",
    "LibraryNotFoundError",
    "library",
    "library_path",
    "library_version",
    "error_string",
]

# The version of the C API this package was written for (HALO_VERSION_CODE).
_API_MAJOR, _API_MINOR = 0, 1


class Result(enum.IntEnum):
    """The C API's result codes (``haloResult``: NCCL's numbers, never reused)."""

    SUCCESS = 0
    UNHANDLED_DEVICE_ERROR = 1
    SYSTEM_ERROR = 2
    INTERNAL_ERROR = 3
    INVALID_ARGUMENT = 4
    INVALID_USAGE = 5
    REMOTE_ERROR = 6
    IN_PROGRESS = 7
    TIMEOUT = 8
    ABORTED = 9

    @property
    def c_name(self) -> str:
        """The name in ffi/include/halo.h, e.g. ``haloInvalidArgument``."""
        return "halo" + "".join(w.capitalize() for w in self.name.split("_"))


class DataType(enum.IntEnum):
    """The C API's element types (``haloDataType``: NCCL's numbers)."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9


class ReduceOp(enum.IntEnum):
    """The C API's reduction operations (``haloRedOp``: NCCL's numbers)."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


class MoeMode(enum.IntEnum):
    """How a MoE routing moves its tokens (``haloMoeMode``)."""

    #: De-duplicate where the routing lets it save rows (a token with two experts on
    #: one other node), else the direct path; decided by one small all-reduce.
    AUTO = 0
    #: One copy of a token per destination node, replicated inside the node.
    DEDUP = 1
    #: One copy per (token, expert): an all-to-all-v.
    DIRECT = 2


class HaloError(Exception):
    """A call into libhalo failed.

    ``code`` is the C result code (a :class:`Result`, which compares equal to the
    ``int`` of ffi/include/halo.h, e.g. ``Result.INVALID_ARGUMENT == 4``); ``message`` is
    what ``haloGetLastError`` said about the failure: the function and what was wrong.
    """

    def __init__(self, code: int, message: str):
        try:
            code = Result(code)
        except ValueError:
            code = int(code)
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        name = self.code.c_name if isinstance(self.code, Result) else "unknown result"
        return f"{name} ({int(self.code)}): {self.message}"


class LibraryNotFoundError(OSError):
    """libhalo could not be found or loaded; the message lists every place tried."""


# ---------------------------------------------------------------------------------
# Finding the library


def _library_file_name() -> str:
    if sys.platform == "darwin":
        return "libhalo.dylib"
    if sys.platform == "win32":
        return "halo.dll"
    return "libhalo.so"


def _candidates():
    """(where, path) pairs in search order, after HALO_LIBRARY."""
    name = _library_file_name()
    package = Path(__file__).resolve().parent
    yield "next to the package", str(package / name)
    # In a checkout: python/halo/_lib.py -> the repository root is two levels up.
    repo = package.parent.parent
    targets = []
    if os.environ.get("CARGO_TARGET_DIR"):
        targets.append(Path(os.environ["CARGO_TARGET_DIR"]))
    targets.append(repo / "target")
    for target in targets:
        for profile in ("release", "debug"):
            yield f"the repository's {profile} build", str(target / profile / name)
    # The system loader: LD_LIBRARY_PATH, the ld.so cache (/usr/local/lib after
    # scripts/install-c.sh and ldconfig), the default directories.
    yield "the system loader", name
    found = ctypes.util.find_library("halo")
    if found and found != name:
        yield "the system loader (find_library)", found


def _try_load(path: str, by_name: bool):
    """(the loaded library, None) or (None, why not)."""
    if not by_name and not os.path.isfile(path):
        return None, "no such file"
    # libfabric links Intel's PSM (libinfinipath), whose load-time constructor replaces
    # the handlers of SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM (Python's
    # KeyboardInterrupt included) with one that writes a backtrace file into the working
    # directory and exits with status 1. It skips that when IPATH_NO_BACKTRACE is set
    # when the library loads, which is now (docs/ARCHITECTURE.md, "Crashes").
    os.environ.setdefault("IPATH_NO_BACKTRACE", "1")
    try:
        return ctypes.CDLL(path), None
    except OSError as e:
        return None, str(e)


_lock = threading.Lock()
_loaded = None  # (CDLL, path)


def _publish_site() -> None:
    """Tells libhalo's device path where this interpreter's packages are
    (``HALO_PYTHON_SITE``: the directories of ``sys.path``), so it finds the CUDA / HIP
    runtime and NCCL / RCCL of torch's wheels (``nvidia/cu13/lib``,
    ``nvidia/nccl/lib``, ``torch/lib``) in a virtual environment or user site too."""
    if os.environ.get("HALO_PYTHON_SITE"):
        return
    dirs = [p for p in sys.path if p and os.path.isdir(p)]
    os.environ["HALO_PYTHON_SITE"] = os.pathsep.join(dict.fromkeys(dirs))


def _load():
    """Loads libhalo once per process: HALO_LIBRARY if set (and only it), else the
    first candidate that loads."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        _publish_site()
        tried = []
        env = os.environ.get("HALO_LIBRARY")
        if env:
            lib, why = _try_load(env, by_name=False)
            if lib is None:
                raise LibraryNotFoundError(
                    f"cannot load libhalo from HALO_LIBRARY={env}: {why} "
                    "(unset HALO_LIBRARY to search next to the package, in the "
                    "repository's target/release and target/debug, and through the "
                    "system loader)"
                )
            found = (lib, env)
        else:
            found = None
            for where, path in _candidates():
                by_name = os.sep not in path
                lib, why = _try_load(path, by_name)
                if lib is not None:
                    found = (lib, path)
                    break
                tried.append(f"  {where}: {path} ({why})")
            if found is None:
                raise LibraryNotFoundError(
                    "cannot find libhalo. Looked in:\n"
                    + "\n".join(tried)
                    + "\nBuild it with `cargo build --release -p halo-ffi` in the HALO "
                    "repository, install it with `scripts/install-c.sh`, or set "
                    "HALO_LIBRARY to the path of libhalo.so."
                )
        lib, path = found
        _declare(lib, path)
        _loaded = (lib, path)
        return _loaded


# ---------------------------------------------------------------------------------
# Prototypes

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_size_p = ctypes.POINTER(ctypes.c_size_t)
_comm_t = ctypes.c_void_p
_c_void_pp = ctypes.POINTER(ctypes.c_void_p)
_result_t = ctypes.c_int32
# Shorthands for the collectives' prototypes.
_vp, _sz, _i32, _int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_int

UNIQUE_ID_BYTES = 128
SPLIT_NOCOLOR = -1
MAX_TAG = 16777215  # HALO_MAX_TAG: user tags of send / recv are 0 .. MAX_TAG


class UniqueId(ctypes.Structure):
    """``haloUniqueId``: 128 opaque bytes."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


CONFIG_MAGIC = 1212238927
CONFIG_UNDEF_INT = -(2**31)
VERSION_CODE = 100


class Config(ctypes.Structure):
    """``haloConfig_t`` (ffi/include/halo.h): start from :meth:`initial`
    (``HALO_CONFIG_INITIALIZER``) and set the fields to change."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("algorithm", ctypes.c_int32),
        ("timeoutMs", ctypes.c_int),
        ("bootstrapTimeoutMs", ctypes.c_int),
        ("provider", ctypes.c_char_p),
        ("topology", ctypes.c_char_p),
    ]

    @classmethod
    def initial(cls) -> "Config":
        return cls(
            ctypes.sizeof(cls), CONFIG_MAGIC, VERSION_CODE,
            CONFIG_UNDEF_INT, CONFIG_UNDEF_INT, CONFIG_UNDEF_INT, None, None,
        )


_PROTOTYPES = {
    "haloCommInitRankConfig": (
        _result_t,
        [ctypes.POINTER(_comm_t), ctypes.c_int, UniqueId, ctypes.c_int, ctypes.POINTER(Config)],
    ),
    "haloGetErrorString": (ctypes.c_char_p, [_result_t]),
    "haloGetVersion": (_result_t, [_c_int_p]),
    "haloGetUniqueId": (_result_t, [ctypes.POINTER(UniqueId)]),
    "haloCommInitRank": (_result_t, [ctypes.POINTER(_comm_t), ctypes.c_int, UniqueId, ctypes.c_int]),
    "haloCommInitFromEnv": (_result_t, [ctypes.POINTER(_comm_t)]),
    "haloCommDestroy": (_result_t, [_comm_t]),
    "haloCommAbort": (_result_t, [_comm_t]),
    "haloCommCount": (_result_t, [_comm_t, _c_int_p]),
    "haloCommUserRank": (_result_t, [_comm_t, _c_int_p]),
    "haloCommSplit": (
        _result_t,
        [_comm_t, ctypes.c_int, ctypes.c_int, ctypes.POINTER(_comm_t), ctypes.c_void_p],
    ),
    "haloGetLastError": (ctypes.c_char_p, [_comm_t]),
    "haloTopologyJson": (_result_t, [_comm_t, ctypes.c_void_p, ctypes.c_size_t, _c_size_p]),
    "haloAllToAll": (
        _result_t,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, _comm_t, ctypes.c_void_p],
    ),
    "haloAllToAllv": (
        _result_t,
        [
            ctypes.c_void_p,
            _c_size_p,
            _c_size_p,
            ctypes.c_void_p,
            _c_size_p,
            _c_size_p,
            ctypes.c_int32,
            _comm_t,
            ctypes.c_void_p,
        ],
    ),
    "haloBarrier": (_result_t, [_comm_t]),
    "haloIAllToAll": (
        _result_t,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, _comm_t, _c_void_pp],
    ),
    "haloIAllToAllv": (
        _result_t,
        [
            ctypes.c_void_p,
            _c_size_p,
            _c_size_p,
            ctypes.c_void_p,
            _c_size_p,
            _c_size_p,
            ctypes.c_int32,
            _comm_t,
            _c_void_pp,
        ],
    ),
    "haloISend": (
        _result_t,
        [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_int, _comm_t, _c_void_pp],
    ),
    "haloIRecv": (
        _result_t,
        [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_int, _comm_t, _c_void_pp],
    ),
    "haloIAllReduce": (
        _result_t,
        [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int32,
            ctypes.c_int32,
            _comm_t,
            _c_void_pp,
        ],
    ),
    "haloIAllGather": (_result_t, [_vp, _vp, _sz, _i32, _comm_t, _c_void_pp]),
    "haloIReduceScatter": (_result_t, [_vp, _vp, _sz, _i32, _i32, _comm_t, _c_void_pp]),
    "haloIBroadcast": (_result_t, [_vp, _vp, _sz, _i32, _int, _comm_t, _c_void_pp]),
    "haloIGather": (_result_t, [_vp, _vp, _sz, _i32, _int, _comm_t, _c_void_pp]),
    "haloIScatter": (_result_t, [_vp, _vp, _sz, _i32, _int, _comm_t, _c_void_pp]),
    "haloIBarrier": (_result_t, [_comm_t, _c_void_pp]),
    "haloISendTagged": (_result_t, [_vp, _sz, _i32, _int, _int, _comm_t, _c_void_pp]),
    "haloIRecvTagged": (_result_t, [_vp, _sz, _i32, _int, _int, _comm_t, _c_void_pp]),
    "haloAllGather": (_result_t, [_vp, _vp, _sz, _i32, _comm_t, _vp]),
    "haloReduceScatter": (_result_t, [_vp, _vp, _sz, _i32, _i32, _comm_t, _vp]),
    "haloBroadcast": (_result_t, [_vp, _vp, _sz, _i32, _int, _comm_t, _vp]),
    "haloGather": (_result_t, [_vp, _vp, _sz, _i32, _int, _comm_t, _vp]),
    "haloScatter": (_result_t, [_vp, _vp, _sz, _i32, _int, _comm_t, _vp]),
    "haloSendTagged": (_result_t, [_vp, _sz, _i32, _int, _int, _comm_t, _vp]),
    "haloRecvTagged": (_result_t, [_vp, _sz, _i32, _int, _int, _comm_t, _vp]),
    "haloMoeHandleCreate": (
        _result_t,
        [_vp, _sz, _int, _vp, _int, _i32, _comm_t, _vp, ctypes.POINTER(ctypes.c_uint64)],
    ),
    "haloMoeHandleGetInfo": (
        _result_t,
        [ctypes.c_uint64, _comm_t, ctypes.POINTER(_sz), _c_int_p, ctypes.POINTER(_sz), _c_int_p],
    ),
    "haloMoeHandleGetLayout": (_result_t, [ctypes.c_uint64, _comm_t, _vp, _vp, _vp, _vp, _vp]),
    "haloMoeHandleFree": (_result_t, [ctypes.c_uint64]),
    "haloMoeDispatch": (_result_t, [_vp, _vp, _sz, _i32, ctypes.c_uint64, _comm_t, _vp]),
    "haloMoeCombine": (_result_t, [_vp, _vp, _sz, _i32, ctypes.c_uint64, _comm_t, _vp]),
    "haloMoeDispatchPairs": (_result_t, [_vp, _vp, _i32, ctypes.c_uint64, _comm_t, _vp]),
    "haloMoeCombinePairs": (_result_t, [_vp, _vp, _i32, ctypes.c_uint64, _comm_t, _vp]),
    "haloIMoeDispatch": (_result_t, [_vp, _vp, _sz, _i32, ctypes.c_uint64, _comm_t, _c_void_pp]),
    "haloIMoeCombine": (_result_t, [_vp, _vp, _sz, _i32, ctypes.c_uint64, _comm_t, _c_void_pp]),
    "haloIMoeDispatchPairs": (_result_t, [_vp, _vp, _i32, ctypes.c_uint64, _comm_t, _c_void_pp]),
    "haloIMoeCombinePairs": (_result_t, [_vp, _vp, _i32, ctypes.c_uint64, _comm_t, _c_void_pp]),
    "haloWait": (_result_t, [ctypes.c_void_p]),
    "haloTest": (_result_t, [ctypes.c_void_p, _c_int_p]),
    "haloAllReduce": (
        _result_t,
        [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int32,
            ctypes.c_int32,
            _comm_t,
            ctypes.c_void_p,
        ],
    ),
}


def _declare(lib, path: str) -> None:
    missing = [name for name in _PROTOTYPES if not hasattr(lib, name)]
    if missing:
        raise LibraryNotFoundError(
            f"{path} is not a libhalo this package can use: it lacks {', '.join(missing)}"
        )
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    version = ctypes.c_int(0)
    lib.haloGetVersion(ctypes.byref(version))
    major, minor = version.value // 10000, version.value // 100 % 100
    if (major, minor) != (_API_MAJOR, _API_MINOR):
        raise LibraryNotFoundError(
            f"{path} is libhalo {major}.{minor}, but this package needs "
            f"{_API_MAJOR}.{_API_MINOR}"
        )


def library():
    """The loaded libhalo (a ``ctypes.CDLL``), loading it on first use."""
    return _load()[0]


def library_path() -> str:
    """The path (or name) libhalo was loaded from, loading it on first use."""
    return _load()[1]


def library_version() -> tuple:
    """The loaded library's version as ``(major, minor, patch)``."""
    v = ctypes.c_int(0)
    check(library().haloGetVersion(ctypes.byref(v)), None)
    return (v.value // 10000, v.value // 100 % 100, v.value % 100)


def error_string(code: int) -> str:
    """``haloGetErrorString``: what a result code means."""
    return library().haloGetErrorString(int(code)).decode("utf-8", "replace")


def last_error(comm) -> str:
    """``haloGetLastError(comm)``, or this thread's last failure for ``None``."""
    lib = library()
    text = lib.haloGetLastError(comm)
    if not text and comm is not None:
        text = lib.haloGetLastError(None)
    return (text or b"").decode("utf-8", "replace")


def check(code: int, comm) -> None:
    """Raises :class:`HaloError` for a failed call, with the library's message."""
    if code != Result.SUCCESS:
        raise HaloError(code, last_error(comm))
