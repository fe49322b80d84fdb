"""Side-by-side loader throughput, one process, one run.

    python -m benchmarks.loader ROOT [--make-data N] [--batch-size 256] [--chains train,eval] [--out DIR]

For each chain (train: RandomResizedCrop(224)+flip+ToTensor+Normalize; eval: Resize(256)+
CenterCrop(224)+ToTensor+Normalize) it times, on the same folder:

- ``torchvision``: ImageFolder + torch DataLoader with every core as a worker (pin_memory on GPU),
  batches moved to the device;
- ``dali-handwritten``: the pipeline a DALI user writes by hand (readers.file -> decode (mixed,
  hw_decoder_load=0.9) -> resize -> crop_mirror_normalize, 8 threads, DALIGenericIterator);
- ``dali-experimental-tv``: DALI's own ``nvidia.dali.experimental.torchvision`` Compose used as the
  ImageFolder transform (per sample, main process; train chain only, on a slice of the data);
- ``gputransforms``: ImageFolder + DataLoader from this package, the user's Compose unchanged.

It prints a table (img/s, ratio to torchvision and to hand-written DALI, time to first batch, GPU
memory in use on the device, peak host RSS), writes JSON and a PNG bar chart. Without a GPU the
same pipelines run on the CPU (DALI's CPU operators). ``--scaling`` adds throughput and memory
against batch size.

``--isolate`` runs each row in a process of its own. Use it for the memory column: in one process
DALI's and torch's memory pools outlive the row that grew them (a later row reuses them and shows
less, or grows them and shows more), so only a fresh process gives each loader's own device memory
(peak in use minus the level once CUDA started: the CUDA context is not counted).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torchvision

from benchmarks.common import bar_chart, make_data, on_gpu, rss_peak_mb, table, timed
from benchmarks.pipelines import pipeline, run_gputransforms


def main(argv=None):
    ap = argparse.ArgumentParser(description="gputransforms loader benchmark")
    ap.add_argument("root")
    ap.add_argument("--make-data", type=int, default=0, metavar="N", help="first write N ImageNet-like JPEGs to ROOT")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--chains", default="train,eval")
    ap.add_argument("--pipelines", default="torchvision,dali-handwritten,dali-experimental-tv,gputransforms")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="torchvision DataLoader workers")
    ap.add_argument("--threads", type=int, default=8, help="DALI threads (hand-written and gputransforms)")
    ap.add_argument("--images", type=int, default=0, help="images timed per pipeline (default: 2 epochs, "
                                                           "1 for torchvision)")
    ap.add_argument("--scaling", action="store_true", help="also gputransforms throughput vs batch size")
    ap.add_argument("--large", type=int, default=0, metavar="N",
                    help="also time the train chain on N 2000-px photos (written next to ROOT)")
    ap.add_argument("--isolate", action="store_true", help="each row in a process of its own (sound memory figures)")
    ap.add_argument("--out", default="bench-out")
    a = ap.parse_args(argv)
    if a.make_data:
        make_data(a.root, a.make_data)
    n_files = len(torchvision.datasets.ImageFolder(a.root).samples)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for chain in a.chains.split(","):
        for name in a.pipelines.split(","):
            if name == "dali-experimental-tv" and chain != "train":
                continue
            threads = a.workers if name.startswith("torchvision") else a.threads
            n = a.images or (n_files if name == "torchvision" else 2 * n_files)
            if name == "dali-experimental-tv":
                n = min(n, 384)
            row = dict(chain=chain, pipeline=name)
            if a.isolate:
                row.update(own_process(a, chain, name, n))
            else:
                try:
                    row.update(timed(pipeline(name)(a.root, chain, a.batch_size, threads), n))
                except Exception as e:  # noqa: BLE001 - one failing pipeline must not hide the others
                    row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
                row["rss_mb"] = rss_peak_mb()
            rows.append(row)
            print(f"  {chain} {name}: {row.get('img_s', float('nan')):.0f} img/s {row.get('error', '')}", flush=True)
        base = {r["pipeline"]: r.get("img_s") for r in rows if r["chain"] == chain}
        for r in rows:
            if r["chain"] == chain and "img_s" in r:
                if base.get("torchvision"):
                    r["x_torchvision"] = r["img_s"] / base["torchvision"]
                if base.get("dali-handwritten"):
                    r["x_dali"] = r["img_s"] / base["dali-handwritten"]
    scaling = []
    if a.scaling:
        for bs in (32, 64, 128, 256, 512, 1024):
            try:
                torch.cuda.empty_cache() if on_gpu() else None
                r = timed(run_gputransforms(a.root, "train", bs, a.threads), 2 * n_files)
                scaling.append(dict(batch_size=bs, img_s=r["img_s"], gpu_mem_mb=r["gpu_mem_mb"]))
                print(f"  scaling batch {bs}: {r['img_s']:.0f} img/s, GPU {r['gpu_mem_mb']:.0f} MiB", flush=True)
            except Exception as e:  # noqa: BLE001
                scaling.append(dict(batch_size=bs, error=str(e).splitlines()[0]))
    large = []
    if a.large:
        from gputransforms import sampledata

        big_root = a.root.rstrip("/") + "-2000px"
        if not Path(big_root).exists():
            sampledata.make_photo_folder(big_root, classes=4, per_class=max(1, a.large // 4), seed=2, long_side=2000,
                                         jobs=os.cpu_count() or 1)
        for name in ("torchvision", "dali-handwritten", "gputransforms"):
            threads = a.workers if name == "torchvision" else a.threads
            row = dict(chain="train-2000px", pipeline=name)
            try:
                row.update(timed(pipeline(name)(big_root, "train", a.batch_size, threads), 2 * a.large))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            row["rss_mb"] = rss_peak_mb()
            large.append(row)
            print(f"  2000px {name}: {row.get('img_s', float('nan')):.0f} img/s", flush=True)
        base = {r["pipeline"]: r.get("img_s") for r in large}
        for r in large:
            if "img_s" in r and base.get("torchvision"):
                r["x_torchvision"] = r["img_s"] / base["torchvision"]
            if "img_s" in r and base.get("dali-handwritten"):
                r["x_dali"] = r["img_s"] / base["dali-handwritten"]
        rows += large
    info = dict(device=torch.cuda.get_device_name() if on_gpu() else "cpu", cores=os.cpu_count(), files=n_files,
                torch=torch.__version__, torchvision=torchvision.__version__, batch_size=a.batch_size,
                torchvision_workers=a.workers, dali_threads=a.threads, process="own per row" if a.isolate else "one")
    try:
        import nvidia.dali

        info["dali"] = nvidia.dali.__version__
    except ImportError:
        pass
    (out / "loader.json").write_text(json.dumps(dict(info=info, rows=rows, scaling=scaling), indent=2))
    bar_chart(rows, out / "loader.png")
    print(json.dumps(info))
    print(table(rows))
    if scaling:
        print("gputransforms train chain vs batch size: " + ", ".join(
            f"{r['batch_size']}: {r['img_s']:.0f} img/s {r['gpu_mem_mb']:.0f} MiB" if "img_s" in r
            else f"{r['batch_size']}: {r['error']}" for r in scaling))
    return rows


def own_process(a, chain: str, name: str, n: int) -> dict:
    """One row timed by ``python -m benchmarks.loader`` in a fresh process: what its loader.json says."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "benchmarks.loader", a.root, "--chains", chain, "--pipelines", name,
               "--images", str(n), "--batch-size", str(a.batch_size), "--workers", str(a.workers),
               "--threads", str(a.threads), "--out", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        try:
            got = json.loads((Path(tmp) / "loader.json").read_text())["rows"][0]
        except (OSError, ValueError, IndexError):
            return dict(error=f"exit {res.returncode}: {res.stderr.strip().splitlines()[-1:]}")
    got.pop("chain", None), got.pop("pipeline", None)
    return got


if __name__ == "__main__":
    main()
