"""Why the same photos load at different rates from an ImageFolder, a Hugging Face table and webdataset
shards (#36): each source timed as ``benchmarks.loader`` times it, with variants that change one thing
(the example's collate_fn or none, shuffled or not), the CPU time of the main thread and of the reader
threads per image, and where the main thread is (sampled every millisecond).

    python -m benchmarks.probes.sources ROOT [--chains train,eval] [--batch-size 256] [--threads 8]
"""
from __future__ import annotations

import argparse
import collections
import sys
import threading
import time

import torch
from torch.utils.data import default_collate

from benchmarks.common import CHAINS, on_gpu, timed, torch_device
from benchmarks.pipelines import Tupled, _hf, _hf_collate, _wds


def _cpu(thread_ids) -> float:
    total = 0.0
    for ident in thread_ids:
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(ident))
        except (OSError, ProcessLookupError):
            pass
    return total


class Sampler:
    """Where the main thread is, every ``interval`` s: the innermost frame of gputransforms, torch or
    DALI (file:function), counted."""

    def __init__(self, interval: float = 0.001, depth: int = 2):
        self.main, self.depth = threading.main_thread().ident, depth
        self.counts: collections.Counter = collections.Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self.thread.start()

    def _run(self, interval):
        while not self.stop.wait(interval):
            frame = sys._current_frames().get(self.main)
            where = []
            while frame is not None and len(where) < self.depth:
                f = frame.f_code.co_filename
                if any(k in f for k in ("gputransforms", "torch", "nvidia", "benchmarks", "datasets", "pyarrow")):
                    where.append(f"{f.rsplit('/', 2)[-2]}/{f.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")
                frame = frame.f_back
            self.counts[" < ".join(where) or "?"] += 1

    def report(self, k: int = 12) -> str:
        self.stop.set()
        self.thread.join()
        n = sum(self.counts.values()) or 1
        return "\n".join(f"    {100 * c / n:5.1f}%  {w}" for w, c in self.counts.most_common(k))


def _dict_collate(batch):
    return default_collate(batch)


def sources(root, chain, bs, threads):
    from gputransforms import DataLoader, datasets
    from gputransforms import transforms as T

    tf = CHAINS[chain](T)
    shuffle = chain != "eval"
    dev = torch_device()
    return {
        "imagefolder": lambda: DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=bs, shuffle=shuffle,
                                          num_workers=threads),
        "imagefolder+collate": lambda: DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=bs,
                                                  shuffle=shuffle, num_workers=threads, collate_fn=_dict_collate),
        "hf": lambda: Tupled(DataLoader(_hf(root, tf), batch_size=bs, shuffle=shuffle, num_workers=threads,
                                        collate_fn=_hf_collate), dev),
        "wds": lambda: DataLoader(_wds(root, tf, shuffle), batch_size=bs, num_workers=threads),
        "wds-inorder": lambda: DataLoader(_wds(root, tf, False), batch_size=bs, num_workers=threads),
    }


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--chains", default="train,eval")
    ap.add_argument("--only", default="")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--images", type=int, default=0)
    ap.add_argument("--sample", action="store_true", help="also where the main thread is (a second run)")
    ap.add_argument("--profile", action="store_true", help="also cProfile of the main thread over one epoch")
    a = ap.parse_args(argv)
    import torchvision

    n_files = len(torchvision.datasets.ImageFolder(a.root).samples)
    n = a.images or 2 * n_files
    for chain in a.chains.split(","):
        for name, make in sources(a.root, chain, a.batch_size, a.threads).items():
            if a.only and name not in a.only.split(","):
                continue
            r = timed(make, n)
            line = f"{chain:6s} {name:20s} {r['img_s']:8.0f} img/s  GPU {r['gpu_mem_mb']:6.0f} MiB"
            if a.sample:
                loader = make()
                it = iter(loader)
                for _ in range(3):
                    next(it)
                readers = [t.ident for t in threading.enumerate() if t.name.startswith("gputransforms-read")]
                main_cpu, read_cpu, wall = time.thread_time(), _cpu(readers), time.perf_counter()
                sampler = Sampler()
                seen = 0
                for b in it:
                    seen += len(b[0])
                if on_gpu():
                    torch.cuda.synchronize()
                where = sampler.report()
                wall = time.perf_counter() - wall
                main_cpu, read_cpu = time.thread_time() - main_cpu, _cpu(readers) - read_cpu
                line += (f"  | sampled epoch rest: {seen / wall:.0f} img/s, main thread {1e6 * main_cpu / seen:.0f} "
                         f"us/img CPU ({100 * main_cpu / wall:.0f}% busy), {len(readers)} readers "
                         f"{1e6 * read_cpu / seen:.0f} us/img\n{where}")
                del loader, it
            if a.profile:
                import cProfile
                import io
                import pstats

                loader = make()
                for _ in loader:
                    break
                prof = cProfile.Profile()
                prof.enable()
                for _ in loader:
                    pass
                prof.disable()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
                line += "\n" + "\n".join(out.getvalue().splitlines()[6:24])
                del loader
            print(line, flush=True)


if __name__ == "__main__":
    main()
