"""Video clips side by side, one process, one run.

    python -m benchmarks.video ROOT [--make-data] [--resolutions 360p,1080p] [--batch-size 16] [--out DIR]

Data (``--make-data``): per resolution, H.264 mp4s (yuv420p, crf 23, GOP 32, 2 B-frames) of 96
frames at 30 fps, of real photos panned and zoomed (``sampledata.make_video_folder``), laid out as
Kinetics (``ROOT/<res>/train/<class>/*.mp4``). Clips of 16 frames, step 16, shuffled; the chain is
torchvision's video reference train preset (Resize (128, 171), flip, Normalize, RandomCrop 112,
ConvertBCHWtoCBHW). Pipelines:

- ``torchvision``: the dataset's own ``__getitem__`` (torchvision's decoder: torchcodec, or PyAV
  where torchcodec cannot load) and the chain, on torch's DataLoader with every core as a worker;
- ``pyav-decode``: decoding alone, PyAV on every core (the CPU decoder's ceiling, no transform);
- ``dali-handwritten``: what a DALI user writes: ``readers.video`` (GPU) with its own clip
  enumeration and shuffle, resize, crop_mirror_normalize, DALIGenericIterator;
- ``gputransforms``: ``datasets.Kinetics`` + ``DataLoader``, the preset unchanged (PyAV in every core's
  worker process, handing over YUV planes; colour conversion and the chain on the GPU);
  ``gputransforms-rgb``: the same with FFmpeg's RGB from the workers (``video_decoder="pyav-rgb"``);
  ``gputransforms-nvdec``: the same with ``video_decoder="nvdec"``.

Reports clips/s and frames/s, JSON and a PNG chart.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
from pathlib import Path

import torch
import torchvision

from benchmarks.common import Moved, torch_device, on_gpu, rss_peak_mb, bar_chart, gc_collect, timed

MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)
FRAMES, STEP = 16, 16
SIZES = {"360p": (360, 640), "720p": (720, 1280), "1080p": (1080, 1920)}


class ConvertBCHWtoCBHW(torch.nn.Module):
    def forward(self, vid):
        return vid.permute(1, 0, 2, 3)


def preset_train(T):
    """torchvision's references/video_classification/presets.py, train."""
    return T.Compose([T.ConvertImageDtype(torch.float32), T.Resize((128, 171), antialias=False),
                      T.RandomHorizontalFlip(), T.Normalize(mean=MEAN, std=STD), T.RandomCrop((112, 112)),
                      ConvertBCHWtoCBHW()])


def make_data(root: str, resolutions, per_class: int = 4, classes: int = 4):
    from gputransforms import sampledata

    for res in resolutions:
        folder = Path(root) / res / "train"
        if folder.exists():
            continue
        sampledata.make_video_folder(folder, classes=classes, per_class=per_class, frames=(96, 96), size=SIZES[res],
                                     fps=(30,), code=False, workers=os.cpu_count() or 1, seed=11, crf=23, gop=32)


def _dataset(root, transform, threads):
    from gputransforms import datasets

    return datasets.Kinetics(root, frames_per_clip=FRAMES, step_between_clips=STEP, transform=transform,
                             num_workers=threads)


def run_torchvision(root, batch_size, workers):
    import torchvision.transforms as T

    def make():
        ds = _dataset(root, preset_train(T), workers)
        return Moved(torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                                                  pin_memory=on_gpu(), persistent_workers=True), torch_device())

    return make


class _Decode(torch.utils.data.Dataset):
    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from gputransforms import video

        path, frames = self.samples[i]
        return torch.from_numpy(video.read_frames(path, frames))


def run_pyav_decode(root, batch_size, workers):
    def make():
        from gputransforms import _compat

        ds = _dataset(root, None, workers)
        vc = ds.video_clips
        samples = [(vc.video_paths[v], _compat.clip_frames(vc, v, c).tolist())
                   for v, c in map(vc.get_clip_location, range(len(ds)))]
        return torch.utils.data.DataLoader(_Decode(samples), batch_size=batch_size, shuffle=True, num_workers=workers,
                                           persistent_workers=True)

    return make


def run_dali_handwritten(root, batch_size, threads):
    def make():
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        files = sorted(glob.glob(os.path.join(root, "train", "*", "*.mp4")))
        classes = sorted({os.path.basename(os.path.dirname(f)) for f in files})
        labels = [classes.index(os.path.basename(os.path.dirname(f))) for f in files]

        @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0, seed=1, prefetch_queue_depth=2)
        def pipe():
            video, label = fn.readers.video(device="gpu", filenames=files, labels=labels, sequence_length=FRAMES,
                                            step=STEP, stride=1, random_shuffle=True, initial_fill=64,
                                            name="reader", pad_last_batch=True)
            video = fn.resize(video, resize_x=171, resize_y=128, antialias=False, dtype=types.FLOAT)
            video = fn.crop_mirror_normalize(
                video, crop=(112, 112), crop_pos_x=fn.random.uniform(range=(0, 1)),
                crop_pos_y=fn.random.uniform(range=(0, 1)), mirror=fn.random.coin_flip(),
                mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD], dtype=types.FLOAT, output_layout="CFHW")
            return video, label

        p = pipe()
        p.build()
        return DALIGenericIterator([p], ["video", "label"], reader_name="reader",
                                   last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    return make


class _DaliBatches:
    def __init__(self, it):
        self.it = it

    def __iter__(self):
        for out in self.it:
            yield out[0]["video"], out[0]["label"]


def run_gputransforms(root, batch_size, threads, **loader_kwargs):
    from gputransforms import DataLoader
    from gputransforms import transforms as T

    def make():
        ds = _dataset(root, preset_train(T), threads)
        return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=threads, **loader_kwargs)

    return make


def parity(root, clips: int, threads: int, **loader_kwargs) -> dict:
    """The loader's frames (``video_decoder``: PyAV's YUV planes converted in the graph, or NVDEC)
    against PyAV's RGB (FFmpeg's colour conversion, as torchcodec's) on the same clips, raw frames,
    in 0-255 units."""
    from gputransforms import DataLoader, _compat, video

    ds = _dataset(root, None, threads)
    vc = ds.video_clips
    diffs, n = [], 0
    for v, _, _ in DataLoader(ds, batch_size=4, num_workers=threads, **loader_kwargs):
        for clip in v:
            path_idx, c = vc.get_clip_location(n)
            ref = torch.from_numpy(video.read_frames(vc.video_paths[path_idx], _compat.clip_frames(vc, path_idx, c).tolist()))
            diffs.append((clip.cpu().permute(0, 2, 3, 1).double() - ref.double()).abs().flatten())
            n += 1
        if n >= clips:
            break
    d = torch.cat(diffs)
    sample = d[torch.randperm(len(d))[:2_000_000]]
    return dict(clips=n, mean=d.mean().item(), p99=torch.quantile(sample, 0.99).item(), max=d.max().item(),
                share_differing=(d > 0).double().mean().item())


PIPELINES = {"torchvision": run_torchvision, "pyav-decode": run_pyav_decode,
             "dali-handwritten": lambda *a: (lambda make: (lambda: _DaliBatches(make())))(run_dali_handwritten(*a)),
             "gputransforms": run_gputransforms,
              # FFmpeg's RGB from the workers instead of YUV planes converted on the GPU (the default)
             "gputransforms-rgb": lambda *a: run_gputransforms(*a, video_decoder="pyav-rgb"),
             # DALI's decoders.video (NVDEC) inside the graph instead of PyAV in worker processes
             "gputransforms-nvdec": lambda *a: run_gputransforms(*a, video_decoder="nvdec")}


def main(argv=None):
    ap = argparse.ArgumentParser(description="gputransforms video benchmark")
    ap.add_argument("root")
    ap.add_argument("--make-data", action="store_true")
    ap.add_argument("--resolutions", default="360p,1080p")
    ap.add_argument("--pipelines", default="torchvision,pyav-decode,dali-handwritten,gputransforms,gputransforms-nvdec")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--threads", type=int, default=8, help="DALI threads")
    ap.add_argument("--clips", type=int, default=0, help="clips timed per pipeline (default: 2 epochs, 1 for NVDEC)")
    ap.add_argument("--parity", type=int, default=0, metavar="N", help="also compare N clips' raw frames with PyAV's")
    ap.add_argument("--out", default="bench-out")
    a = ap.parse_args(argv)
    resolutions = a.resolutions.split(",")
    if a.make_data:
        make_data(a.root, resolutions)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, parities = [], {}
    for res in resolutions:
        root = os.path.join(a.root, res)
        if a.parity:
            decoders = ("pyav-yuv", "nvdec") if on_gpu() else ("pyav-yuv",)
            parities[res] = {d: parity(root, a.parity, a.threads, video_decoder=d) for d in decoders}
            print(f"  {res} decode vs PyAV, 0-255 units: {parities[res]}", flush=True)
        n_clips = len(glob.glob(os.path.join(root, "train", "*", "*.mp4"))) * (96 // STEP)
        for name in a.pipelines.split(","):
            # gputransforms decodes in num_workers processes: every core, as torchvision's DataLoader gets
            threads = a.threads if name in ("dali-handwritten", "gputransforms-nvdec") else a.workers
            row = dict(chain=res, pipeline=name)
            try:
                n = a.clips or (n_clips if name == "gputransforms-nvdec" else 2 * n_clips)
                row.update(timed(PIPELINES[name](root, a.batch_size, threads), n, warmup_batches=2))
                row["clips_s"] = row.pop("img_s")
                row["frames_s"] = row["clips_s"] * FRAMES
            except Exception as e:  # noqa: BLE001 - one failing pipeline must not hide the others
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            row["rss_mb"] = rss_peak_mb()
            rows.append(row)
            gc_collect()
            print(f"  {res} {name}: {row.get('clips_s', float('nan')):.1f} clips/s "
                  f"{row.get('frames_s', float('nan')):.0f} frames/s {row.get('error', '')}", flush=True)
        base = {r["pipeline"]: r.get("clips_s") for r in rows if r["chain"] == res}
        for r in rows:
            if r["chain"] == res and "clips_s" in r:
                for key, ref in (("x_torchvision", "torchvision"), ("x_dali", "dali-handwritten")):
                    if base.get(ref):
                        r[key] = r["clips_s"] / base[ref]
    info = dict(device=torch.cuda.get_device_name() if on_gpu() else "cpu", cores=os.cpu_count(),
                torch=torch.__version__, torchvision=torchvision.__version__, batch_size=a.batch_size,
                frames_per_clip=FRAMES, workers=a.workers, dali_threads=a.threads)
    (out / "video.json").write_text(json.dumps(dict(info=info, rows=rows, parity=parities), indent=2))
    bar_chart([dict(r, img_s=r["frames_s"]) for r in rows if "frames_s" in r], out / "video.png", "frames/s")
    print(json.dumps(info))
    head = f"{'video':8} {'pipeline':18} {'clips/s':>8} {'frames/s':>9} {'x tv':>6} {'x dali':>7} {'1st s':>6} {'GPU MiB':>8}"
    print(head + "\n" + "-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['chain']:8} {r['pipeline']:18} n/a ({r['error'][:80]})")
        else:
            print(f"{r['chain']:8} {r['pipeline']:18} {r['clips_s']:8.1f} {r['frames_s']:9.0f} "
                  f"{r.get('x_torchvision', 0):6.2f} {r.get('x_dali', 0):7.2f} {r['ttfb_s']:6.2f} {r['gpu_mem_mb']:8.0f}")
    return rows


if __name__ == "__main__":
    main()
