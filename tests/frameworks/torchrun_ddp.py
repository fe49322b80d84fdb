"""README's torchrun recipe, run under torchrun (2 processes; gloo on the CPU, NCCL with one GPU per
rank): DistributedSampler + set_epoch, side by side with torch's DataLoader, only the class swapped.
Each rank writes, per case, the (file index, label) pairs it saw, read from the pixels.

    torchrun --nproc_per_node=2 tests/frameworks/torchrun_ddp.py DATA OUT [--device gpu]
    torchrun --nproc_per_node=2 tests/frameworks/torchrun_ddp.py DATA OUT --fail   # a bad file on rank 1
"""
import argparse
import json
import os
import pickle
import sys

import torch
import torch.distributed as dist
import torch.utils.data as tud
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import decode_index  # noqa: E402
from gputransforms import DataLoader, datasets  # noqa: E402
from gputransforms import transforms as T  # noqa: E402

TF = T.Compose([T.Resize((32, 32)), T.PILToTensor()])


def seen(batch):
    x, y = batch
    return [[int(i), int(t)] for i, t in zip(decode_index(x)[0], y.tolist())]


def loader_for(kind, ds, sampler, device, batch_size=4, drop_last=False):
    if kind == "torch":
        return tud.DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=drop_last)
    return DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=drop_last, device=device)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fail", action="store_true")
    a = ap.parse_args()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if a.device == "gpu":
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if a.device == "gpu" else "gloo")
    ds = datasets.ImageFolder(a.data, transform=TF)
    if a.fail:
        # rank 1 reaches the corrupt file (DistributedSampler without shuffling: rank r gets r, r+2, ...);
        # each step ends in a collective, as DDP's backward does
        loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=False), device=a.device)
        for x, _ in loader:
            dist.all_reduce(torch.ones(1, device=x.device))
        print(f"rank {rank}: finished without error", flush=True)
        dist.destroy_process_group()
        return
    results = {}
    for kind in ("torch", "ours"):
        for shuffle in (True, False):
            for drop_last in (False, True):
                # drop_last on both: the sampler's (no padding) and the loader's (no partial batch)
                sampler = DistributedSampler(ds, shuffle=shuffle, seed=3, drop_last=drop_last)
                loader = loader_for(kind, ds, sampler, a.device, drop_last=drop_last)
                for epoch in range(2):
                    sampler.set_epoch(epoch)
                    results[f"{kind}/shuffle{int(shuffle)}-drop{int(drop_last)}/{epoch}"] = [
                        s for b in loader for s in seen(b)]
        # resume: after 2 batches of epoch 1 the state is saved (a file, as a checkpoint would), and
        # a new loader over a new sampler goes on from it
        sampler = DistributedSampler(ds, shuffle=True, seed=3)
        loader = loader_for(kind, ds, sampler, a.device)
        sampler.set_epoch(1)
        it = iter(loader)
        head = [s for _ in range(2) for s in seen(next(it))]
        path = os.path.join(a.out, f"{kind}-state-rank{rank}.pkl")
        with open(path, "wb") as f:
            pickle.dump(loader.state_dict() if kind == "ours" else {"batches": 2}, f)
        del it
        sampler = DistributedSampler(ds, shuffle=True, seed=3)
        sampler.set_epoch(1)
        with open(path, "rb") as f:
            saved = pickle.load(f)
        if kind == "ours":
            resumed = DataLoader(ds, batch_size=4, sampler=sampler, device=a.device)
            resumed.load_state_dict(saved)
            rest = [s for b in resumed for s in seen(b)]
        else:  # torch's DataLoader has no state: skip what was consumed
            rest = [s for b in list(tud.DataLoader(ds, batch_size=4, sampler=sampler))[saved["batches"]:]
                    for s in seen(b)]
        results[f"{kind}/resume"] = [head, rest]
        results[f"{kind}/state-bytes"] = os.path.getsize(path)
    results["devices"] = sorted({str(b[0].device) for b in DataLoader(ds, batch_size=8, device=a.device,
                                                                        sampler=DistributedSampler(ds))})
    with open(os.path.join(a.out, f"torchrun-rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
