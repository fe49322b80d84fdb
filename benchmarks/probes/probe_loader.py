"""Loader-level variants of one chain (where the hand-off and the Python feed cost): img/s of
gputransforms.DataLoader under different settings, one process.

    python -m benchmarks.probes.probe_loader ROOT [--chain eval,train]
"""
import argparse
import itertools

from benchmarks.common import CHAINS, timed


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--chain", default="eval")
    ap.add_argument("--batch-size", type=int, default=256)
    a = ap.parse_args(argv)
    from gputransforms import DataLoader, datasets
    from gputransforms import transforms as T

    n = 2 * len(datasets.ImageFolder(a.root).samples)
    for chain, (threads, shuffle, prefetch) in itertools.product(a.chain.split(","),
                                                                 [(8, False, 2), (8, True, 2), (16, False, 2),
                                                                  (8, False, 4), (12, True, 3)]):
        def make():
            ds = datasets.ImageFolder(a.root, transform=CHAINS[chain](T))
            return DataLoader(ds, batch_size=a.batch_size, shuffle=shuffle, num_workers=threads,
                              prefetch_factor=prefetch)

        r = timed(make, n)
        print(f"{chain} threads={threads:2} shuffle={shuffle!s:5} prefetch={prefetch}: {r['img_s']:7.0f} img/s, "
              f"first batch {r['ttfb_s']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
