"""One rank of test_torch.py's dead-rank job: after a few all-reduces, rank 2 dies
(os._exit, no goodbye); the others, blocked in the next all-reduce, must raise
torch.distributed.DistBackendError within torch's timeout (HALO_TEST_TIMEOUT_S)."""

import datetime
import os
import time

import torch
import torch.distributed as dist

import halo.torch  # noqa: F401

timeout = datetime.timedelta(seconds=float(os.environ.get("HALO_TEST_TIMEOUT_S", "20")))
dist.init_process_group("halo", timeout=timeout)
me, n = dist.get_rank(), dist.get_world_size()
for _ in range(3):
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert t[0].item() == n
dist.barrier()
if me == 2:
    os._exit(3)
start = time.monotonic()
try:
    for _ in range(100):
        dist.all_reduce(torch.ones(1000))
        time.sleep(0.01)
except dist.DistBackendError as e:
    print(f"rank {me}: raised DistBackendError after {time.monotonic() - start:.3f} s: {e}", flush=True)
    os._exit(0)
print(f"rank {me}: no error although rank 2 died", flush=True)
os._exit(1)
