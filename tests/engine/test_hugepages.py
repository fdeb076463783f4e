"""engine.platforms.cpu_hugepages: the packed weights and the KV cache ask for transparent
huge pages before they are touched, and get them where the kernel allows."""
from __future__ import annotations

import pytest
import torch

from engine.platforms import cpu_hugepages


def fake_thp(tmp_path, text: str):
    d = tmp_path / "sys/kernel/mm/transparent_hugepage"
    d.mkdir(parents=True)
    (d / "enabled").write_text(text)
    return tmp_path


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    assert cpu_hugepages.thp_mode(fake_thp(tmp_path, "always [madvise] never\n")) == "madvise"
    assert cpu_hugepages.thp_mode(tmp_path / "none") is None


def anon_huge_kb(t: torch.Tensor) -> int:
    """AnonHugePages of the mapping that holds t's first byte (/proc/self/smaps)."""
    addr, inside = t.data_ptr(), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


def needs_thp():
    mode = cpu_hugepages.thp_mode()
    if mode not in ("always", "madvise"):
        pytest.skip(f"this kernel's transparent huge pages are {mode or 'absent'}")


def test_a_large_tensor_gets_huge_pages_and_a_small_one_is_left_alone():
    needs_thp()
    big = cpu_hugepages.empty((16 << 20,), torch.uint8)
    big.fill_(1)
    assert anon_huge_kb(big) >= 2048
    small = cpu_hugepages.empty((1000,), torch.float32).fill_(1)  # below 2 MiB: torch's allocator
    if cpu_hugepages.thp_mode() == "madvise":  # under `always` the heap may be huge anyway
        assert anon_huge_kb(small) == 0


def test_packed_weights_lie_in_huge_pages():
    needs_thp()
    from engine.model_executor.layers.linear import pack_panels

    packed = pack_panels(torch.randn(2048, 2048))  # 16 MiB, streamed at every step
    assert anon_huge_kb(packed) >= 2048


def mapped(addr: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


def test_a_transient_tensor_is_unmapped_when_freed():
    """A quantized weight as read, freed once packed: its pages go back to the
    system, not into a heap hole (whatever the THP mode)."""
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("mappings of their own on Linux only")
    # glibc then serves up to 16 MiB from its heap (a freed mapped chunk raises the threshold)
    torch.empty(16 << 20, dtype=torch.int8).fill_(0)
    t = cpu_hugepages.transient((8 << 20,), torch.int8).fill_(1)
    addr = t.data_ptr()
    assert mapped(addr)
    del t
    assert not mapped(addr)
    assert cpu_hugepages.transient((100,), torch.int8).numel() == 100  # small: torch's allocator
