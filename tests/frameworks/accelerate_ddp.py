"""Run under torchrun (2 processes): Accelerate's prepare() and skip_first_batches() over torch's
DataLoader and over gputransforms.DataLoader, only the class swapped. Each rank writes, per case, the
(file index, label) pairs it saw (read from the pixels) and what it was iterating.

    torchrun --nproc_per_node=2 tests/frameworks/accelerate_ddp.py DATA OUT [--gpu]
"""
import argparse
import json
import os
import sys

import torch
import torch.utils.data as tud

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from accelerate import Accelerator, DataLoaderConfiguration, skip_first_batches  # noqa: E402

from conftest import decode_index  # noqa: E402
from gputransforms import DataLoader, datasets  # noqa: E402
from gputransforms import transforms as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--gpu", action="store_true")
    a = ap.parse_args()
    ds = datasets.ImageFolder(a.data, transform=T.Compose([T.Resize((8, 8)), T.PILToTensor()]))
    results = {}

    def epoch(loader):
        seen, devices = [], set()
        for x, y in loader:
            devices.add(str(x.device))
            seen += list(zip(decode_index(x)[0], y.tolist()))
        return seen, sorted(devices)

    cases = {"shuffle1-drop0": dict(shuffle=True), "shuffle0-drop0": dict(shuffle=False),
             "shuffle1-drop1": dict(shuffle=True, drop_last=True)}
    configs = {"default": {}, "split_batches": dict(split_batches=True), "uneven": dict(even_batches=False)}
    for kind, cls in (("torch", tud.DataLoader), ("ours", DataLoader)):
        for cname, config in configs.items():
            acc = Accelerator(cpu=not a.gpu, dataloader_config=DataLoaderConfiguration(**config))
            for case, kw in cases.items():
                torch.manual_seed(0)
                prepared = acc.prepare(cls(ds, batch_size=4, **kw))
                results[f"{kind}/{cname}/{case}"] = [epoch(prepared)[0] for _ in range(2)]
                results[f"{kind}/{cname}/{case}/iterates"] = type(prepared.base_dataloader).__module__
                results[f"{kind}/{cname}/{case}/devices"] = epoch(prepared)[1]
            acc.free_memory()
        results[f"{kind}/backend"] = getattr(cls(ds, batch_size=4), "backend", "torch")
        acc = Accelerator(cpu=not a.gpu)
        torch.manual_seed(0)
        prepared = acc.prepare(cls(ds, batch_size=4, shuffle=False))
        results[f"{kind}/skip2"] = epoch(skip_first_batches(prepared, 2))[0]
        # mid-epoch resume as Accelerate documents it: save_state after 2 batches, then in a "new run"
        # load_state and skip_first_batches(2); the rest of the epoch and the next are the uninterrupted run's
        seedable = DataLoaderConfiguration(use_seedable_sampler=True)  # Accelerate's reproducible shuffle
        torch.manual_seed(0)
        dl = Accelerator(cpu=not a.gpu, dataloader_config=seedable).prepare(cls(ds, batch_size=4, shuffle=True))
        full = []
        for e in range(2):
            dl.set_epoch(e)
            full.append(epoch(dl)[0])
        acc = Accelerator(cpu=not a.gpu, dataloader_config=seedable)
        torch.manual_seed(0)
        m, dl = acc.prepare(torch.nn.Linear(1, 1), cls(ds, batch_size=4, shuffle=True))
        dl.set_epoch(0)
        it, head = iter(dl), []
        for _ in range(2):
            x, y = next(it)
            head += list(zip(decode_index(x)[0], y.tolist()))
        state_dir = os.path.join(a.out, f"{kind}-state")
        acc.save_state(state_dir)
        del it
        torch.manual_seed(0)  # the same script, the same seed (Accelerate: set_seed); load_state restores the rest
        acc = Accelerator(cpu=not a.gpu, dataloader_config=seedable)
        m, dl = acc.prepare(torch.nn.Linear(1, 1), cls(ds, batch_size=4, shuffle=True))
        acc.load_state(state_dir)
        dl.set_epoch(0)
        rest = epoch(acc.skip_first_batches(dl, 2))[0]
        dl.set_epoch(1)
        results[f"{kind}/resume"] = dict(full=full, head=head, rest=rest, next=epoch(dl)[0])
    rank = int(os.environ.get("RANK", 0))
    with open(os.path.join(a.out, f"accelerate-rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
