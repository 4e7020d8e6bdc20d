"""numpy arrays and torch tensors as (pointer, shape, data type) for the C API.

Neither numpy nor torch is imported here: an object is recognised by the module that
is already loaded (whoever made the array imported it).
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

    __slots__ = ("obj", "ptr", "shape", "dtype", "dtype_name", "itemsize", "numel")

    def __init__(self, obj, ptr, shape, dtype, dtype_name, itemsize):
        self.obj = obj
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


def _torch_buffer(torch, t, what: str, writable: bool) -> Buffer:
    if t.layout != torch.strided:
        raise ValueError(f"{what} is a {t.layout} tensor; HALO needs a dense (strided) tensor")
    if t.device.type != "cpu":
        raise ValueError(
            f"{what} is on device {t.device}, but HALO's transports move host memory: pass "
            "a CPU tensor (tensor.cpu()), or keep device tensors on torch.distributed "
            "(NCCL/RCCL) until HALO has a device transport"
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
    return Buffer(t, t.data_ptr(), t.shape, code, f"torch.{name}", t.element_size())


def as_buffer(obj, what: str, writable: bool = False) -> Buffer:
    """The buffer of a numpy array or torch tensor; ``TypeError`` for anything else or
    an unsupported data type, ``ValueError`` for memory HALO cannot use (not
    contiguous, on a device, read-only when ``writable``)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _numpy_buffer(np, obj, what, writable)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _torch_buffer(torch, obj, what, writable)
    raise TypeError(f"{what} must be a numpy.ndarray or a torch.Tensor, not {type(obj).__name__}")
