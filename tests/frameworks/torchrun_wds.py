"""A webdataset pipeline under torchrun (2 processes, gloo on the CPU): webdataset's split_by_node
gives each rank its shards; each rank writes, for our DataLoader and torch's over the same pipeline,
the (file index, label) pairs it saw, read from the pixels.

    torchrun --nproc_per_node=2 tests/frameworks/torchrun_wds.py "SHARDS-{000000..000003}.tar" OUT
"""
import json
import os
import sys

import torch.distributed as dist
import torch.utils.data as tud
import webdataset as wds

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import decode_index  # noqa: E402
from gputransforms import DataLoader  # noqa: E402
from gputransforms import transforms as T  # noqa: E402


def pairs(loader):
    return [[int(i), int(t)] for x, y in loader for i, t in zip(decode_index(x)[0], y.tolist())]


def main():
    url, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = wds.WebDataset(url, shardshuffle=False, nodesplitter=wds.split_by_node, empty_check=False) \
        .decode("pil").to_tuple("jpg", "cls").map_tuple(T.Compose([T.Resize((16, 16)), T.PILToTensor()]), int)
    loader = DataLoader(ds, batch_size=4, device="cpu")
    result = {"backend": loader.backend, "ours": [pairs(loader) for _ in range(2)],
              "torch": pairs(tud.DataLoader(ds, batch_size=4))}
    with open(os.path.join(out, f"wds-rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
