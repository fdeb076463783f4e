"""The shared-memory all-reduce: two processes sum (and gather) tensors of
several sizes and dtypes, many calls in a row (the two buffers reused), equal
to the sum in rank order (the ranks' tensors side by side); an aborted wait
raises instead of hanging."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.distributed import shm_all_reduce
from engine.distributed.shm_all_reduce import ShmAllReduce

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not shm_all_reduce.supported(), reason="x86 only")

# One rank: sums tensors of several sizes (one small row up to a slot's 4 MiB)
# and dtypes, three rounds (the two buffers reused many times), each checked
# against both ranks' tensors added in rank order.
RANK = """
import sys, torch
from engine.distributed.shm_all_reduce import ShmAllReduce
path, rank = sys.argv[1], int(sys.argv[2])
def tensor(r, call, n, dtype):
    g = torch.Generator().manual_seed(1000 * call + 10 * r + n)
    return torch.randn(n, generator=g).to(dtype)
ar = ShmAllReduce(path, rank, 2, 30, create=False)
calls = [(n, d) for _ in range(3) for n in (64, 512, 512 * 16, 1 << 20)
         for d in (torch.float32, torch.bfloat16)]
for call, (n, dtype) in enumerate(calls):
    if call % 3 == 2:  # an all-gather between the sums (the logits'), the same buffers
        got = torch.cat(ar.all_gather(tensor(rank, call, n, dtype).view(2, -1)), dim=-1)
        want = torch.cat([tensor(r, call, n, dtype).view(2, -1) for r in (0, 1)], dim=-1)
        assert torch.equal(got, want), (call, n)
        continue
    got = ar.all_reduce(tensor(rank, call, n, dtype))
    assert torch.equal(got, tensor(0, call, n, dtype) + tensor(1, call, n, dtype)), (call, n)
print("ok", len(calls))
"""


@pytest.mark.slow
def test_two_ranks_sum_in_rank_order(tmp_path):
    path = str(tmp_path / "ar")
    ShmAllReduce(path, 0, 2, 30, create=True)  # sized here; the ranks map it
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, path, str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.split() == ["ok", "24"], err[-2000:]


def test_a_wait_on_a_dead_peer_raises_when_aborted(tmp_path):
    path = str(tmp_path / "ar")
    ar = ShmAllReduce(path, 0, 2, 30, create=True)
    ShmAllReduce(path, 1, 2, 30, create=False).abort()  # as the watchdog does
    with pytest.raises(RuntimeError, match="aborted: a rank died"):
        ar.all_reduce(torch.ones(8))
    os.unlink(path)


def test_only_what_fits_goes_through_shared_memory(tmp_path):
    ar = ShmAllReduce(str(tmp_path / "ar"), 0, 2, 30, create=True)
    assert ar.fits(torch.ones(1 << 20))
    assert not ar.fits(torch.ones((1 << 20) + 1))
    assert not ar.fits(torch.ones(8, 8).t())  # not contiguous
