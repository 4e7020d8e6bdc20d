"""HALO from Python: topology-aware all-to-all for Mixture-of-Experts training.

A thin layer over libhalo's C API (ffi/include/halo.h) with ctypes; no compiled
extension. Under a launcher (``halo launch -n 4 -- python3 train.py``, torchrun,
mpirun, srun)::

    import numpy as np
    import halo

    with halo.init() as comm:                      # rank and size from the environment
        send = np.arange(10, dtype=np.float32).reshape(5, 2)
        splits = [2, 0, 3, 0][: comm.size]         # rows for each rank (dim 0)
        ...
        comm.all_to_all_single(recv, send, output_split_sizes=recv_splits,
                               input_split_sizes=splits)

The communicator has torch.distributed's collectives (``all_reduce``, ``all_gather``,
``reduce_scatter``, ``broadcast``, ``gather``, ``scatter``, ``barrier``,
``all_to_all_single``, ``all_to_all``, ``send`` / ``recv`` / ``isend`` / ``irecv``
with tags); ``async_op=True`` returns a :class:`Work`.

Arrays are contiguous CPU numpy arrays or torch tensors. Errors that libhalo reports
raise :class:`HaloError` (``.code``: the C result code, ``.message``: what
``haloGetLastError`` said). :mod:`halo.torch` has torch.distributed's signatures for
PyTorch and Megatron-LM.

libhalo is found through ``HALO_LIBRARY`` (a path; when set, only it is tried), else
next to this package, else in the HALO repository's ``target/release`` and
``target/debug`` (``$CARGO_TARGET_DIR`` first), else by the system loader.
"""

from ._comm import Communicator, MoeHandle, Work, get_unique_id, init, init_rank
from ._lib import (
    MAX_TAG,
    DataType,
    HaloError,
    LibraryNotFoundError,
    MoeMode,
    ReduceOp,
    Result,
    error_string,
    library_path,
    library_version,
)

__version__ = "0.1.0"

__all__ = [
    "Communicator",
    "DataType",
    "HaloError",
    "LibraryNotFoundError",
    "MAX_TAG",
    "MoeHandle",
    "MoeMode",
    "ReduceOp",
    "Result",
    "Work",
    "error_string",
    "get_unique_id",
    "init",
    "init_rank",
    "library_path",
    "library_version",
    "__version__",
]
