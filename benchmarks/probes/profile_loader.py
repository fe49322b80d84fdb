"""Where the main thread's time goes in gputransforms' loop (cProfile over N epochs of ROOT).

    python -m benchmarks.probes.profile_loader ROOT [--chain train] [--epochs 2] [--threads 8]
"""
import argparse
import cProfile
import pstats
import time

import torch

from benchmarks.common import CHAINS


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--chain", default="train")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=256)
    a = ap.parse_args(argv)
    from gputransforms import DataLoader, datasets
    from gputransforms import transforms as T

    loader = DataLoader(datasets.ImageFolder(a.root, transform=CHAINS[a.chain](T)), batch_size=a.batch_size,
                        shuffle=True, num_workers=a.threads)
    for _ in loader:  # warm-up epoch
        pass
    prof = cProfile.Profile()
    n, t0 = 0, time.perf_counter()
    prof.enable()
    for _ in range(a.epochs):
        for x, _ in loader:
            n += x.shape[0]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.disable()
    dt = time.perf_counter() - t0
    print(f"{a.chain}: {n / dt:.0f} img/s under cProfile ({n} images, {dt:.2f} s)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
