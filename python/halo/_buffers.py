"""numpy arrays and torch tensors as (pointer, shape, data type) for the C API.

Neither numpy nor torch is imported here: an object is recognised by the module that
is already loaded (whoever made the array imported it).

Device memory (the device path, issue 17): a CUDA / ROCm torch tensor, or any object
with ``__cuda_array_interface__`` (CuPy, Numba, ...), becomes a buffer with a
``stream``: torch's current stream of the tensor's device
(``torch.cuda.current_stream(device).cuda_stream``), or the interface's own. The
default stream (handle 0) is passed as ``cudaStreamLegacy`` (1), because a NULL stream
means host memory to libhalo. Only the all-to-all calls take device buffers
(``device_ok``); the others refuse them before anything reaches libhalo.
"""

from __future__ import annotations

import sys

from ._lib import DataType

__all__ = ["Buffer", "as_buffer", "SUPPORTED"]

SUPPORTED = (
    "int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64 "
    "and bool (moved as uint8)"
)

# numpy: (kind, itemsize) -> DataType. bfloat16 (ml_dtypes) is matched by name.
_NUMPY = {
    ("i", 1): DataType.INT8,
    ("u", 1): DataType.UINT8,
    ("b", 1): DataType.UINT8,
    ("i", 4): DataType.INT32,
    ("u", 4): DataType.UINT32,
    ("i", 8): DataType.INT64,
    ("u", 8): DataType.UINT64,
    ("f", 2): DataType.FLOAT16,
    ("f", 4): DataType.FLOAT32,
    ("f", 8): DataType.FLOAT64,
}

# torch: dtype attribute name -> DataType (uint32 / uint64 exist in newer torch only).
_TORCH = {
    "int8": DataType.INT8,
    "uint8": DataType.UINT8,
    "bool": DataType.UINT8,
    "int32": DataType.INT32,
    "uint32": DataType.UINT32,
    "int64": DataType.INT64,
    "uint64": DataType.UINT64,
    "float16": DataType.FLOAT16,
    "bfloat16": DataType.BFLOAT16,
    "float32": DataType.FLOAT32,
    "float64": DataType.FLOAT64,
}


class Buffer:
    """Caller memory as the C API sees it. ``obj`` keeps the array alive."""

    __slots__ = ("obj", "ptr", "shape", "dtype", "dtype_name", "itemsize", "numel", "stream")

    def __init__(self, obj, ptr, shape, dtype, dtype_name, itemsize, stream=None):
        self.obj = obj
        #: The device stream (an int handle) for device memory; None for host memory.
        self.stream = stream
        self.ptr = ptr
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.dtype_name = dtype_name
        self.itemsize = itemsize
        n = 1
        for s in self.shape:
            n *= s
        self.numel = n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def row_elements(self) -> int:
        """Elements per index of dim 0 (the product of the other dimensions)."""
        n = 1
        for s in self.shape[1:]:
            n *= s
        return n


def _numpy_buffer(np, a, what: str, writable: bool) -> Buffer:
    dt = a.dtype
    code = None
    if dt.names is None and dt.subdtype is None:
        code = _NUMPY.get((dt.kind, dt.itemsize))
        if code is None and dt.name == "bfloat16" and dt.itemsize == 2:
            code = DataType.BFLOAT16  # ml_dtypes.bfloat16
    if code is None:
        raise TypeError(f"{what}: numpy dtype {dt} is not supported by HALO (supported: {SUPPORTED})")
    if dt.itemsize > 1 and not dt.isnative:
        raise TypeError(f"{what}: numpy dtype {dt} is not in this machine's byte order")
    if not a.flags.c_contiguous:
        raise ValueError(
            f"{what} is not C-contiguous (shape {a.shape}, strides {a.strides}); "
            "pass numpy.ascontiguousarray(...) or a copy"
        )
    if writable and not a.flags.writeable:
        raise ValueError(f"{what} is read-only; HALO writes the result into it")
    return Buffer(a, a.ctypes.data, a.shape, code, f"numpy.{dt.name}", dt.itemsize)


# cudaStreamLegacy: the legacy default stream as a non-NULL handle.
STREAM_LEGACY = 1


def _device_stream(handle) -> int:
    """A stream handle for libhalo: never 0 (NULL means host memory there)."""
    h = int(handle or 0)
    return STREAM_LEGACY if h == 0 else h


def _torch_buffer(torch, t, what: str, writable: bool, device_ok: bool) -> Buffer:
    if t.layout != torch.strided:
        raise ValueError(f"{what} is a {t.layout} tensor; HALO needs a dense (strided) tensor")
    stream = None
    if t.device.type == "cuda" and device_ok:
        # CUDA and ROCm builds of torch both call their devices "cuda".
        if getattr(torch.version, "hip", None) and torch.cuda.current_stream(t.device).cuda_stream == 0:
            raise ValueError(
                f"{what} is on {t.device} and the current stream is ROCm's default stream, "
                "which has no non-NULL handle: run the call under `with torch.cuda.stream(s):` "
                "with a stream s = torch.cuda.Stream()"
            )
        stream = _device_stream(torch.cuda.current_stream(t.device).cuda_stream)
    elif t.device.type != "cpu":
        raise ValueError(
            f"{what} is on device {t.device}, but this call moves host memory: pass a CPU "
            "tensor (tensor.cpu()); only all_to_all_single and all_to_all take CUDA / ROCm "
            "tensors (HALO's device path)"
        )
    name = str(t.dtype).rsplit(".", 1)[-1]
    code = _TORCH.get(name)
    if code is None:
        raise TypeError(f"{what}: torch dtype {t.dtype} is not supported by HALO (supported: {SUPPORTED})")
    if not t.is_contiguous():
        raise ValueError(
            f"{what} is not contiguous (shape {tuple(t.shape)}, stride {t.stride()}); "
            "pass tensor.contiguous()"
        )
    if writable and t.requires_grad and t.is_leaf:
        raise ValueError(f"{what} is a leaf tensor that requires grad; HALO cannot write into it")
    return Buffer(t, t.data_ptr(), t.shape, code, f"torch.{name}", t.element_size(), stream)


# __cuda_array_interface__ typestr kind + size -> DataType (as numpy's).
def _interface_buffer(obj, cai, what: str, writable: bool, device_ok: bool) -> Buffer:
    if not device_ok:
        raise ValueError(
            f"{what} is device memory (__cuda_array_interface__), but this call moves host "
            "memory; only all_to_all_single and all_to_all take device arrays"
        )
    try:
        ptr, readonly = cai["data"]
        shape = tuple(int(x) for x in cai["shape"])
        typestr = str(cai["typestr"])
    except (KeyError, TypeError, ValueError) as e:
        raise TypeError(f"{what}: malformed __cuda_array_interface__ ({e})") from e
    if len(typestr) < 3 or typestr[0] not in "<|=" or not typestr[2:].isdigit():
        raise TypeError(f"{what}: typestr {typestr!r} is not a little-endian scalar type")
    kind, size = typestr[1], int(typestr[2:])
    code = _NUMPY.get((kind, size))
    if code is None:
        raise TypeError(f"{what}: typestr {typestr!r} is not supported by HALO (supported: {SUPPORTED})")
    strides = cai.get("strides")
    if strides is not None:
        want, acc = [], size
        for d in reversed(shape):
            want.append(acc)
            acc *= d
        if tuple(strides) != tuple(reversed(want)):
            raise ValueError(f"{what} is not C-contiguous (strides {tuple(strides)})")
    if writable and readonly:
        raise ValueError(f"{what} is read-only; HALO writes the result into it")
    return Buffer(obj, int(ptr), shape, code, f"cuda.{typestr[1:]}", size, _device_stream(cai.get("stream")))


def as_buffer(obj, what: str, writable: bool = False, device_ok: bool = False) -> Buffer:
    """The buffer of a numpy array, a torch tensor or (with ``device_ok``) a device array
    (CUDA / ROCm tensor, ``__cuda_array_interface__``); ``TypeError`` for anything else
    or an unsupported data type, ``ValueError`` for memory HALO cannot use (not
    contiguous, on a device without ``device_ok``, read-only when ``writable``)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _numpy_buffer(np, obj, what, writable)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _torch_buffer(torch, obj, what, writable, device_ok)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _interface_buffer(obj, cai, what, writable, device_ok)
    raise TypeError(
        f"{what} must be a numpy.ndarray or a torch.Tensor (or a device array with "
        f"__cuda_array_interface__), not {type(obj).__name__}"
    )
