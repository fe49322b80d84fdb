"""Long runs and abandoned loaders: memory stays flat, nothing is left running."""
import gc
import os

import pytest
import torch

from gputransforms import DataLoader, datasets
from gputransforms import transforms as T

from conftest import DEVICES


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def gpu_mb() -> float:
    """Device-wide (DALI's pools are not torch's): run the GPU tests of this file with the GPU to
    themselves; another process starting on it between two marks reads as growth here (measured:
    +529 MiB from a parallel pytest group's CUDA context; 0 MiB alone)."""
    if not torch.cuda.is_available():
        return 0.0
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


@pytest.mark.parametrize("device", DEVICES)
def test_fifty_epochs_flat_memory(indexed_folder, device):
    tf = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()])
    loader = DataLoader(datasets.ImageFolder(str(indexed_folder), transform=tf), batch_size=8, shuffle=True,
                        device=device, num_workers=2)
    marks = {}
    for e in range(1, 51):
        n = sum(len(y) for _, y in loader)
        assert n == 37
        if e in (1, 5, 50):
            gc.collect()
            marks[e] = (rss_mb(), gpu_mb(), os_threads())
    print(f"\nsoak [{device}] epoch: (RSS MiB, GPU MiB device-wide, OS threads): {marks}")
    # after warm-up (epoch 5) nothing grows: 45 more epochs may not add more than a few MiB
    assert marks[50][0] - marks[5][0] < 25, marks
    assert marks[50][1] - marks[5][1] < 64, marks
    assert marks[50][2] == marks[5][2], marks


@pytest.mark.parametrize("device", DEVICES)
def test_abandoned_recreated_and_interrupted_loaders_leave_nothing(indexed_folder, device):
    ds = datasets.ImageFolder(str(indexed_folder), transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]))
    gc.collect()
    threads0 = os_threads()

    def interrupted():
        loader = DataLoader(ds, batch_size=4, shuffle=True, device=device, num_workers=2)
        try:
            for k, _ in enumerate(loader):
                if k == 2:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        # the same loader goes on after the interruption
        assert sum(len(y) for _, y in loader) == len(ds)

    gc.disable()  # released when the last reference goes, not whenever the cycle collector runs
    try:
        for _ in range(5):  # abandoned mid-epoch, then re-created
            loader = DataLoader(ds, batch_size=4, shuffle=True, device=device, num_workers=2)
            it = iter(loader)
            next(it)
            del loader, it
            interrupted()
        assert os_threads() <= threads0 + 1, (threads0, os_threads())
    finally:
        gc.enable()
    loader = DataLoader(ds, batch_size=4, device=device, num_workers=2)
    next(iter(loader))
    loader.close()
    assert os_threads() <= threads0 + 1, (threads0, os_threads())
