"""End to end: one training loop fed in turn by each loader, against the model alone.

    python -m benchmarks.train DATA [--models resnet18,resnet50] [--chains train,ta_wide]
        [--feeds model,dali-handwritten,gputransforms,torchvision] [--images 20000] [--out bench-out/train]

The loop is a torchvision model by name (any of ``torchvision.models``), SGD with momentum, bf16
autocast and channels_last, cross-entropy on the folder's classes. Feeds:

- ``model``: the model alone on one resident batch (the ceiling);
- ``dali-handwritten``: benchmarks/loader.py's hand-written DALI pipeline (for ta_wide: DALI's own
  TrivialAugmentWide, without RandomErasing);
- ``gputransforms``: ImageFolder + gputransforms.DataLoader with the user's Compose; and its probes
  (``benchmarks.loader.pipeline``): ``-qN`` (N batches prepared ahead), ``-hwNN`` (the hardware JPEG
  decoder's share), ``gputransforms-graphnorm`` (DALI's graph normalising to float32 instead of
  compiler/handoff.py), ``gputransforms-inmemory`` (files read and checked beforehand),
  ``gputransforms-switch1ms`` (the GIL's switch interval at 1 ms, for the rest of the process);
- ``torchvision``: ImageFolder + torch's DataLoader with every core as a worker, pinned, moved;
- any feed with ``-x2`` (``gputransforms-x2``): two pipelines of it taken in turn (a probe, see
  ``alternating``);
- any feed with ``@hi`` (``gputransforms@hi``): the same, with the loop (the loader's iterator and the
  training step) on a CUDA stream of the highest priority, so that the GPU's block scheduler serves
  the model's kernels before DALI's, whose streams have the default (lowest) priority (DALI 2.4 no
  longer lets a pipeline choose its streams' priority); ``@side``: on a non-blocking stream of the
  default priority instead of the legacy default stream; ``@smN``: on a stream of a CUDA green context
  of N SMs, so that the model's kernels leave the other SMs to the loader's (``model@smN``: the
  model alone on N SMs).

Models are torchvision's by name; ``resnet18:graph`` (the step captured in one CUDA graph: the same
GPU work, one launch a step) and ``resnet18:tiny`` (the eager step on a resident 8x64x64 batch: about
the same launches, little GPU work) are probes of whether a loader beside the model is held back by
the GPU or by the host. ``--mark FILE`` touches FILE when the warm-up ends, for tracers outside the
process (``benchmarks/probes/``).

``--isolate`` measures as users run it: each feed in its own process (``python -m benchmarks.train``
again, with ``--epochs``), over whole epochs of the folder, the first epoch (start-up, warm-up)
reported apart from the rest; there ``gputransforms-late`` is ours imported after CUDA started (after
the model is on the GPU, as in a notebook), beside ``gputransforms`` imported first. ``--epochs N``
alone runs that whole-epoch loop in this process.

Each figure is img/s over ``--images`` images after 10 warm-up steps, epochs restarting as a training
loop's would. Reported beside it: the fraction of the model alone, the device memory the run takes
beyond the model's own (device-wide peak, sampled, minus the level of the model-alone run; and of it
torch's caching allocator's peak, the rest being DALI's pools and libraries), the main
process's CPU seconds per 1,000 images (all its threads; torchvision's workers are other processes),
the host time spent waiting in ``next()``, and the main thread's own CPU time per step, in ``next()``
and in the training step (a loop whose main thread is busy for the whole step is bound by the host,
whatever the GPU does). ``--profile`` adds a breakdown from torch.profiler:
GPU kernel time per step, the model's against the loader's (DALI and nvJPEG kernels by name), and
from the kernels' intervals on every stream the time the GPU runs any kernel, none (idle), and the
loader's beside the model's.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import torch
import torchvision

from benchmarks.common import (PeakGpuMemory, bar_chart, cuda_sync, gc_collect, gpu_mem_used, make_data, on_gpu,
                               torch_device)
from benchmarks.pipelines import pipeline

WARMUP = 10


def release():
    """Free what the previous feed held, DALI's memory pools included (they outlive a pipeline and
    would be reused by the next feed, hiding its memory)."""
    import sys

    gc_collect()
    if "nvidia.dali" in sys.modules and on_gpu():
        import nvidia.dali.backend as backend

        backend.ReleaseUnusedMemory()


def make_model(name: str, classes: int, dev, batch_size: int = 256):
    """The training step of torchvision model ``name``; a suffix makes a probe of what bounds a
    loader beside it: ``:graph``, the same step captured once in a CUDA graph and replayed (the same
    GPU work, one launch a step from the host); ``:tiny``, the same eager step on a resident batch
    of 8 at 64x64 whatever the loader gives (about the same launches from the host, little GPU work)."""
    name, _, mode = name.partition(":")
    if mode not in ("", "graph", "tiny"):
        raise ValueError(f"model suffix :{mode}: only :graph or :tiny")
    if mode == "graph" and dev.type != "cuda":
        raise ValueError("model suffix :graph: a CUDA graph needs a CUDA device")
    model = getattr(torchvision.models, name)(num_classes=classes).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    dtype = torch.bfloat16

    def step(x, y):
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=dtype):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if mode == "tiny":
        tx = torch.randn(8, 3, 64, 64, device=dev)
        ty = torch.randint(0, classes, (8,), device=dev)
        return lambda x, y: step(tx, ty)
    if mode == "graph":
        return _graphed(model, opt, loss_fn, dtype, step, classes, dev, batch_size)
    return step


def _graphed(model, opt, loss_fn, dtype, step, classes: int, dev, batch_size: int):
    """The whole training step captured in one CUDA graph (torch's documented whole-network
    capture); each step copies the batch into the graph's input and replays it (an epoch's partial
    last batch takes the eager step)."""
    sx = torch.randn(batch_size, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last)
    sy = torch.randint(0, classes, (batch_size,), device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(3):
            step(sx, sy)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        with torch.autocast(dev.type, dtype=dtype, cache_enabled=False):
            loss = loss_fn(model(sx), sy)
        loss.backward()
        opt.step()

    def replay(x, y):
        if len(x) != batch_size:
            return step(x, y)
        sx.copy_(x)
        sy.copy_(y)
        graph.replay()

    return replay


def batches(make):
    """Endless (x, y) batches, epoch after epoch, with int64 class labels."""
    loader = make()
    while True:
        for b in loader:
            x, y = b[0], b[1]
            yield x, y.reshape(-1).long()


def alternating(make, k: int):
    """``k`` loaders of the feed, each over the whole set, taken in turn: a probe of whether the
    loader's throughput beside the model is bound by one pipeline's stages (not a way to train:
    every image comes k times an epoch)."""
    sources = [batches(make) for _ in range(k)]
    while True:
        for src in sources:
            yield next(src)


def run(step, source, n_images: int, batch_size: int, profile: bool = False, warmup: int = WARMUP,
        mark: str = "") -> dict:
    for _ in range(warmup):
        step(*next(source))
    cuda_sync()
    if mark:  # for a tracer outside (e.g. an LD_PRELOAD library) to drop what came before
        Path(mark).touch()
    t0, cpu0 = time.perf_counter(), time.process_time()
    counted, waited, steps = 0, 0.0, 0
    next_cpu = step_cpu = 0.0  # the main thread's own CPU time, in next() and in the step
    while counted < n_images:
        t, c = time.perf_counter(), time.thread_time()
        x, y = next(source)
        waited += time.perf_counter() - t
        c2 = time.thread_time()
        next_cpu += c2 - c
        step(x, y)
        step_cpu += time.thread_time() - c2
        counted += len(x)
        steps += 1
    cuda_sync()
    elapsed = time.perf_counter() - t0
    out = dict(img_s=counted / elapsed, images=counted, cpu_s_per_1k=1000 * (time.process_time() - cpu0) / counted,
               wait_ms_per_step=1000 * waited / (counted / batch_size), step_ms=1000 * elapsed / steps,
               main_next_cpu_ms=1000 * next_cpu / steps, main_step_cpu_ms=1000 * step_cpu / steps)
    if profile:
        out["profile"] = kernel_breakdown(step, source)
    return out


def run_epochs(step, make, epochs: int, steps_per_epoch: int = 0) -> dict:
    """A plain training script's loop: ``epochs`` whole passes over the loader ``make()`` builds (or,
    for the model alone, ``steps_per_epoch`` steps on its resident batch), timed one by one. img/s is
    over the epochs after the first (which holds the start-up and the warm-up), reported apart."""
    loader = make()
    per_epoch = []
    first_ms = []  # per epoch: from its start (the GPU idle) to its first batch in the loop's hands
    for _ in range(epochs):
        cuda_sync()
        t0, n, first = time.perf_counter(), 0, None
        source = (next(loader) for _ in range(steps_per_epoch)) if steps_per_epoch else iter(loader)
        for b in source:
            if first is None:
                first = time.perf_counter() - t0
            x, y = b[0], b[1].reshape(-1).long()
            step(x, y)
            n += len(x)
        cuda_sync()
        per_epoch.append((n, time.perf_counter() - t0))
        first_ms.append(1e3 * (first or 0.0))
    later = per_epoch[1:] or per_epoch
    return dict(img_s=sum(n for n, _ in later) / sum(t for _, t in later), images=sum(n for n, _ in later),
                first_epoch_img_s=per_epoch[0][0] / per_epoch[0][1], epoch_img_s=[n / t for n, t in per_epoch],
                first_batch_ms=first_ms)


def isolated(a, argv_base: list) -> list:
    """Each (model, chain, feed) in its own process over whole epochs; the rows its train.json holds."""
    import subprocess
    import sys
    import tempfile

    rows = []
    for model_name in a.models.split(","):
        for chain in a.chains.split(","):
            for name in a.feeds.split(","):
                late = name.endswith("-late")
                with tempfile.TemporaryDirectory() as tmp:
                    cmd = [sys.executable, "-m", "benchmarks.train", a.root, "--models", model_name, "--chains", chain,
                           "--feeds", name[:-len("-late")] if late else name, "--epochs", str(a.epochs),
                           "--out", tmp, *argv_base] + (["--late-import"] if late else [])
                    res = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
                    try:
                        got = json.loads((Path(tmp) / "train.json").read_text())["rows"]
                    except (OSError, ValueError):
                        got = [dict(model=model_name, chain=chain, error=f"exit {res.returncode}: "
                                                                          f"{res.stderr.strip().splitlines()[-1:]}")]
                for r in got:
                    r.update(feed=name, process="own")
                    rows.append(r)
                print(f"  {model_name} {chain} {name} (own process): {got[0].get('img_s', float('nan')):.0f} img/s "
                      f"(first epoch {got[0].get('first_epoch_img_s', float('nan')):.0f}; each epoch's first batch "
                      f"after {', '.join(f'{v:.0f}' for v in got[0].get('first_batch_ms', []))} ms) "
                      f"{got[0].get('error', '')}",
                      flush=True)
            alone = next((r.get("img_s") for r in rows if r["model"] == model_name and r["chain"] == chain
                          and r["feed"] == "model"), None)
            for r in rows:
                if alone and r["model"] == model_name and r["chain"] == chain and "img_s" in r:
                    r["of_model"] = r["img_s"] / alone
    return rows


def kernel_breakdown(step, source, steps: int = 20) -> dict:
    """GPU kernel time per step over ``steps`` steps: the loader's (DALI's and nvJPEG's kernels, by
    name) and the rest (the model's, and any torch kernels a loader runs on the model's stream); and
    from the kernels' intervals on all streams, the time the GPU runs any kernel (``busy``), the
    model's and the loader's kernels at the same time (``overlap``) and none (``idle``), per step."""
    from torch.profiler import ProfilerActivity, profile

    cuda_sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step(*next(source))
        cuda_sync()
        wall = time.perf_counter() - t0
    loader_us = model_us = 0.0
    top: dict = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        if not us or e.key.startswith(("ProfilerStep", "cudaStream", "cudaMemcpy", "cudaLaunch")):
            continue
        name = e.key.lower()
        if getattr(e, "device_type", None) is not None and "cuda" not in str(e.device_type).lower():
            continue
        if _is_loader_kernel(name):
            loader_us += us
            top[e.key[:80]] = top.get(e.key[:80], 0.0) + us
        else:
            model_us += us
    busiest = sorted(top.items(), key=lambda kv: -kv[1])[:5]
    out = dict(wall_ms_per_step=1000 * wall / steps, model_kernels_ms_per_step=model_us / 1000 / steps,
               loader_kernels_ms_per_step=loader_us / 1000 / steps,
               loader_top=[(k, round(v / 1000 / steps, 3)) for k, v in busiest])
    out.update(timeline(prof.events(), steps))
    return out


def _is_loader_kernel(name: str) -> bool:
    return "dali" in name or "nvjpeg" in name or "nvimgcodec" in name


def timeline(events, steps: int) -> dict:
    """Per step, from the kernels' (start, end) on every stream: the GPU running any kernel, the
    model's and the loader's at the same time, and the loader's kernel launches."""
    model, loader = [], []
    for e in events:
        if "cuda" not in str(getattr(e, "device_type", "")).lower():
            continue
        name = e.name.lower()
        if name.startswith(("memcpy", "memset")):
            continue
        (loader if _is_loader_kernel(name) else model).append((e.time_range.start, e.time_range.end))
    if not model and not loader:
        return {}
    busy_m, busy_l, busy = _union(model), _union(loader), _union(model + loader)
    span = max(end for _, end in model + loader) - min(start for start, _ in model + loader)
    per = lambda us: round(us / 1000 / steps, 3)  # noqa: E731
    return dict(gpu_span_ms_per_step=per(span), busy_ms_per_step=per(busy), idle_ms_per_step=per(span - busy),
                model_busy_ms_per_step=per(busy_m), loader_busy_ms_per_step=per(busy_l),
                overlap_ms_per_step=per(busy_m + busy_l - busy), loader_launches_per_step=round(len(loader) / steps, 1))


def _union(intervals: list) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def on_stream(where: str, dev):
    """The context a feed runs in: ``hi``, a CUDA stream of the highest priority; ``side``, one of the
    default priority (a probe: unlike the legacy default stream the loop uses otherwise, torch's
    streams do not wait for other libraries' blocking streams); ``smN``, a stream of a green context
    of N SMs (``probes/green.py``: the loop's kernels, the model's, on N SMs only, DALI's on any);
    else the current one."""
    if where.startswith("sm") and where[2:].isdigit():
        if dev.type != "cuda":
            raise ValueError(f"feed suffix @{where}: a green context needs a CUDA device")
        from benchmarks.probes.green import green_stream

        stream = green_stream(int(where[2:]), dev.index or 0)
        stream.wait_stream(torch.cuda.current_stream(dev))
        return torch.cuda.stream(stream)
    if where in ("hi", "side") and dev.type == "cuda":
        return torch.cuda.stream(torch.cuda.Stream(dev, priority=-100 if where == "hi" else 0))  # -100: the highest
    if where not in ("", "hi", "side"):
        raise ValueError(f"feed suffix @{where}: only @hi, @side or @smN")
    return contextlib.nullcontext()


def feed(name: str, root: str, chain: str, batch_size: int, workers: int, threads: int, dev, classes: int):
    if name == "model":
        def resident():
            x = torch.randn(batch_size, 3, 224, 224, device=dev)
            y = torch.randint(0, classes, (batch_size,), device=dev)
            while True:
                yield x, y
        return resident()
    base, _, k = name.partition("-x")
    make = pipeline(base if k.isdigit() else name)(root, chain, batch_size,
                                                     workers if name == "torchvision" else threads)
    return alternating(make, int(k)) if k.isdigit() else batches(make)


def epochs_of(a, name: str, chain: str, dev, classes: int, step) -> dict:
    """``run_epochs`` for a feed: the model alone takes as many steps an epoch as the folder has batches."""
    if name == "model":
        n = len(torchvision.datasets.folder.make_dataset(a.root, torchvision.datasets.folder.find_classes(a.root)[1],
                                                         torchvision.datasets.folder.IMG_EXTENSIONS))
        resident = feed("model", a.root, chain, a.batch_size, a.workers, a.threads, dev, classes)
        return run_epochs(step, lambda: resident, a.epochs, steps_per_epoch=max(1, n // a.batch_size))
    base = pipeline(name)(a.root, chain, a.batch_size, a.workers if name == "torchvision" else a.threads)
    return run_epochs(step, base, a.epochs)


def main(argv=None):
    ap = argparse.ArgumentParser(description="training-loop benchmark")
    ap.add_argument("root")
    ap.add_argument("--make-data", type=int, default=0, metavar="N")
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--chains", default="train,ta_wide")
    ap.add_argument("--feeds", default="model,dali-handwritten,gputransforms,torchvision")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--images", type=int, default=20000, help="images timed per run (after the warm-up)")
    ap.add_argument("--torchvision-images", type=int, default=0, help="fewer for torchvision's slower feed")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="steps before timing")
    ap.add_argument("--mark", default="", metavar="FILE", help="touch FILE when the warm-up ends (for outside tracers)")
    ap.add_argument("--out", default="bench-out/train")
    ap.add_argument("--isolate", action="store_true", help="each feed in its own process, whole epochs")
    ap.add_argument("--epochs", type=int, default=0, help="whole epochs instead of --images (first apart)")
    ap.add_argument("--late-import", action="store_true", help="import gputransforms after CUDA started")
    a = ap.parse_args(argv)
    if a.isolate:
        a.epochs = a.epochs or 3
        passed = ["--batch-size", str(a.batch_size), "--workers", str(a.workers), "--threads", str(a.threads)]
        rows = isolated(a, passed)
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "train.json").write_text(json.dumps(dict(info=dict(mode="isolated", epochs=a.epochs), rows=rows),
                                                   indent=2))
        return
    if a.late_import and on_gpu():  # CUDA starts first (a model moved to the GPU), then the import
        torch.zeros(1, device=torch_device())
    # as a user's script that swapped its imports: gputransforms imported before CUDA starts, so it can
    # widen the driver's work queues (device.widen_cuda_connections) for every feed of the run; with
    # CUDA_DEVICE_MAX_CONNECTIONS set beforehand (8: the driver's default) it leaves them as they are
    import gputransforms  # noqa: F401

    if a.make_data and not Path(a.root).exists():
        make_data(a.root, a.make_data)
    dev = torch_device()
    classes = len(torchvision.datasets.folder.find_classes(a.root)[0])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model_name in a.models.split(","):
        step = make_model(model_name, classes, dev, a.batch_size)
        for chain in a.chains.split(","):
            alone = None
            base_mem = base_torch = 0
            for name in a.feeds.split(","):
                if name == "model" and alone is not None:
                    continue
                release()
                if on_gpu():
                    torch.cuda.reset_peak_memory_stats()
                mem = PeakGpuMemory()
                row = dict(model=model_name, chain=chain, feed=name)
                base, _, where = name.partition("@")
                try:
                    n = a.torchvision_images if base == "torchvision" and a.torchvision_images else a.images
                    with on_stream(where, dev):
                        if a.epochs:
                            row.update(epochs_of(a, base, chain, dev, classes, step))
                        else:
                            row.update(run(step, feed(base, a.root, chain, a.batch_size, a.workers, a.threads, dev,
                                                      classes), n, a.batch_size, a.profile and base != "torchvision",
                                           a.warmup, a.mark))
                    row["mem_mb"] = (max(mem.peak, gpu_mem_used()) - mem.base) / 2**20
                    # of it, torch's caching allocator's peak (the model's tensors, and the batches
                    # the loop holds); the rest is DALI's pools and libraries
                    row["torch_mb"] = torch.cuda.max_memory_reserved() / 2**20 if on_gpu() else 0.0
                except Exception as e:  # noqa: BLE001 - one failing feed must not hide the others
                    row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
                mem.stop_mb()
                if name == "model" and "img_s" in row:
                    alone, base_mem, base_torch = row["img_s"], row["mem_mb"], row["torch_mb"]
                rows.append(row)
            for r in rows:
                if r["model"] == model_name and r["chain"] == chain and "img_s" in r and alone:
                    r["of_model"] = r["img_s"] / alone
                    r["mem_beyond_model_mb"] = r["mem_mb"] - base_mem
                    r["torch_beyond_model_mb"] = r["torch_mb"] - base_torch
            dali = next((r.get("img_s") for r in rows if r["model"] == model_name and r["chain"] == chain
                         and r["feed"] == "dali-handwritten"), None)
            for r in rows:
                if r["model"] == model_name and r["chain"] == chain and "img_s" in r and dali:
                    r["x_dali"] = r["img_s"] / dali
            for r in rows:
                if r["model"] == model_name and r["chain"] == chain:
                    print(f"  {model_name} {chain} {r['feed']}: {r.get('img_s', float('nan')):.0f} img/s "
                          f"({r.get('of_model', 0):.2f} of the model, {r.get('x_dali', 0):.2f}x DALI, "
                          f"+{r.get('mem_beyond_model_mb', 0):.0f} MiB (torch +{r.get('torch_beyond_model_mb', 0):.0f}), "
                          f"{r.get('cpu_s_per_1k', 0):.2f} CPU s/1k, "
                          f"wait {r.get('wait_ms_per_step', 0):.1f} ms/step; step {r.get('step_ms', 0):.1f} ms, main thread CPU "
                          f"{r.get('main_next_cpu_ms', 0):.1f} in next() + {r.get('main_step_cpu_ms', 0):.1f} in the step) "
                          f"{r.get('error', '')}", flush=True)
                    if "profile" in r:
                        print(f"      profile: {r['profile']}", flush=True)
        del step
        gc_collect()
    info = dict(device=torch.cuda.get_device_name() if on_gpu() else "cpu", cores=os.cpu_count(), classes=classes,
                torch=torch.__version__, torchvision=torchvision.__version__, batch_size=a.batch_size,
                images=a.images, workers=a.workers, dali_threads=a.threads,
                cuda_device_max_connections=os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "unset (8)"))
    (out / "train.json").write_text(json.dumps(dict(info=info, rows=rows), indent=2))
    chart = [dict(r, chain=f"{r['model']} {r['chain']}", pipeline=r["feed"], shape=[a.batch_size])
             for r in rows if "img_s" in r]
    bar_chart(chart, out / "train.png")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
