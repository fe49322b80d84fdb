"""README's torchrun recipe timed: 1 rank against N ranks on one host, the train chain, images/s per
rank and in aggregate; and what resuming costs (``state_dict()``, and seconds to the first batch after
``load_state_dict`` against a fresh start). Run on the GPU machine:

    python -m benchmarks.ddp DATA [--gpus 2] [--epochs 4] [--out bench-out/ddp.json]

Each rank runs ``gputransforms.DataLoader(ImageFolder(DATA, train chain), DistributedSampler)`` on its
own GPU with its share of the cores (the loader's default), into an empty loop; epoch times are taken
between barriers, so the aggregate is the images of all ranks over the slowest rank's time. The first
epoch is a warm-up; the figure is the median of the others.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(a):
    import torch
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    from benchmarks.common import CHAINS
    from gputransforms import DataLoader, datasets
    from gputransforms import transforms as T

    rank, local, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    ds = datasets.ImageFolder(a.data, transform=CHAINS[a.chain](T))
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=a.batch_size, sampler=sampler)
    times, images = [], 0
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        images = 0
        for x, y in loader:
            images += len(x)
        torch.cuda.synchronize()
        t_rank = time.perf_counter() - t0
        dist.barrier()
        times.append((t_rank, time.perf_counter() - t0))
    result = dict(rank=rank, world=world, images_per_epoch=images, threads=loader.num_threads,
                  rank_img_s=[round(images / t) for t, _ in times], epoch_s=[round(t, 3) for _, t in times],
                  backend=loader.backend, device=str(torch.cuda.current_device()))
    if rank == 0 and world == 1:
        result["resume"] = resume_costs(ds, a, DataLoader, DistributedSampler, torch)
    Path(a.out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def resume_costs(ds, a, DataLoader, DistributedSampler, torch) -> dict:
    """state_dict() after k batches, and seconds to the first batch of a new loader: fresh against
    resumed at batch k (both build their pipeline; the resumed one skips k batches of indices)."""
    def first_batch(state=None):
        sampler = DistributedSampler(ds, shuffle=True, seed=0)
        sampler.set_epoch(1)
        t0 = time.perf_counter()
        loader = DataLoader(ds, batch_size=a.batch_size, sampler=sampler)
        if state is not None:
            loader.load_state_dict(state)
        x, _ = next(iter(loader))
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    sampler.set_epoch(1)
    loader = DataLoader(ds, batch_size=a.batch_size, sampler=sampler)
    it = iter(loader)
    k = min(20, len(loader) - 1)
    for _ in range(k):
        next(it)
    t0 = time.perf_counter()
    for _ in range(100):
        state = loader.state_dict()
    cost = (time.perf_counter() - t0) / 100
    del it
    fresh = [first_batch() for _ in range(3)]
    resumed = [first_batch(state) for _ in range(3)]
    return dict(at_batch=k, state_dict_ms=round(cost * 1e3, 3), state_bytes=len(pickle.dumps(state)),
                fresh_first_batch_s=[round(t, 3) for t in fresh], resumed_first_batch_s=[round(t, 3) for t in resumed])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--chain", default="train")
    ap.add_argument("--out", default="bench-out/ddp.json")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out-dir", default="")
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a)
    report = {}
    for g in sorted({1, a.gpus}):
        d = Path(a.out).parent / f"ddp-{g}"
        d.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={g}", "--master_addr=127.0.0.1",
               "--master_port=29541", "-m", "benchmarks.ddp", a.data, "--worker", "--out-dir", str(d),
               "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--chain", a.chain]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True)
        if res.returncode:
            sys.exit(res.stdout[-2000:] + res.stderr[-4000:])
        ranks = [json.loads((d / f"rank{r}.json").read_text()) for r in range(g)]
        epochs = [max(r["epoch_s"][e] for r in ranks) for e in range(1, a.epochs)]  # after the warm-up
        total = sum(r["images_per_epoch"] for r in ranks)
        report[f"{g}gpu"] = dict(
            aggregate_img_s=round(total / statistics.median(epochs)),
            per_rank_img_s=[round(statistics.median(r["rank_img_s"][1:])) for r in ranks],
            epochs_aggregate_img_s=[round(total / t) for t in epochs],
            images_per_rank=[r["images_per_epoch"] for r in ranks], threads_per_rank=ranks[0]["threads"],
            backend=sorted({r["backend"] for r in ranks}), devices=[r["device"] for r in ranks])
        if "resume" in ranks[0]:
            report["resume"] = ranks[0]["resume"]
    if a.gpus > 1:
        report["speedup"] = round(report[f"{a.gpus}gpu"]["aggregate_img_s"] / report["1gpu"]["aggregate_img_s"], 2)
    report["cores"] = len(os.sched_getaffinity(0))
    Path(a.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
