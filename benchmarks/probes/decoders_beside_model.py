"""Probe (#15): JPEG decoders on the GPU beside a training model, each alone and beside it.

    python -m benchmarks.probes.decoders_beside_model ROOT [--seconds 8] [--batch-size 256] [--out FILE]

Decoders (decode only, no resize): DALI's mixed decoder (fn.readers.file -> fn.decoders.image,
8 threads, hw_decoder_load 0.9) and torchvision's batched ``decode_jpeg(device="cuda")`` on a stream
of its own; each runs in a thread, free-running, while the main thread runs benchmarks/train.py's
eager ResNet-18 training step on a resident batch, also free-running. Reported:
img/s of the decoder alone, and of both side by side (a loader and a model that do not wait for
each other: what each gets of the GPU). Needs a CUDA device."""
from __future__ import annotations

import argparse
import glob
import json
import os
import threading
import time

import torch
import torchvision
from torchvision.io import decode_jpeg, read_file

from benchmarks.train import make_model


def dali_decoder(root: str, batch_size: int, threads: int = 8):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=torch.cuda.current_device(),
                  prefetch_queue_depth=2)
    def pipe():
        jpegs, _ = fn.readers.file(file_root=root, random_shuffle=True)
        return fn.decoders.image(jpegs, device="mixed", output_type=types.RGB, hw_decoder_load=0.9)

    p = pipe()
    p.build()

    def one():
        p.run()
        return batch_size
    return one


def torchvision_decoder(files: list, batch_size: int):
    data = [read_file(f) for f in files]
    stream = torch.cuda.Stream()
    at = [0]

    def one():
        k = at[0]
        at[0] = (k + batch_size) % max(1, len(data) - batch_size + 1)
        with torch.cuda.stream(stream):
            out = decode_jpeg(data[k:k + batch_size], device="cuda")
        stream.synchronize()
        return len(out)
    return one


def measure(seconds: float, decode=None, step=None, batch_size: int = 0) -> tuple[float, float]:
    """(model img/s, decoder img/s) over ``seconds``, each free-running (the model's step, on its
    ``batch_size`` images, in this thread; the decoder in another)."""
    stop, count = threading.Event(), [0]
    for _ in range(3):  # warm-up
        if decode:
            decode()
        if step:
            step()
    torch.cuda.synchronize()

    def loop():
        while not stop.is_set():
            count[0] += decode()
    worker = threading.Thread(target=loop) if decode else None
    steps, t0 = 0, time.perf_counter()
    if worker:
        worker.start()
    while time.perf_counter() - t0 < seconds:
        if step:
            step()
            steps += 1
            if steps % 8 == 0:  # the host no further than 8 steps ahead, as a loss.item() every few steps would
                torch.cuda.synchronize()
        else:
            time.sleep(0.01)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    stop.set()
    if worker:
        worker.join()
    return steps * batch_size / elapsed, count[0] / elapsed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--files", type=int, default=4096, help="files torchvision's decoder cycles through (held in memory)")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decoders_beside_model: needs a CUDA device")
    dev = torch.device("cuda", torch.cuda.current_device())
    files = sorted(glob.glob(os.path.join(a.root, "*", "*")))
    classes = len(torchvision.datasets.folder.find_classes(a.root)[0])
    train_step = make_model("resnet18", classes, dev, a.batch_size)
    x = torch.randn(a.batch_size, 3, 224, 224, device=dev)
    y = torch.randint(0, classes, (a.batch_size,), device=dev)

    def step():
        train_step(x, y)
    alone = measure(a.seconds, step=step, batch_size=a.batch_size)[0]
    rows = [dict(decoder="none", model_img_s=alone)]
    print(f"model alone: {alone:.0f} img/s", flush=True)
    for name, make in (("dali", lambda: dali_decoder(a.root, a.batch_size)),
                       ("torchvision", lambda: torchvision_decoder(files[:a.files], a.batch_size))):
        decode = make()
        dec_alone = measure(a.seconds, decode=decode)[1]
        m, d = measure(a.seconds, decode=decode, step=step, batch_size=a.batch_size)
        rows.append(dict(decoder=name, decoder_alone_img_s=dec_alone, decoder_beside_img_s=d, model_beside_img_s=m,
                         decoder_kept=d / dec_alone, model_kept=m / alone))
        print(f"{name}: decoder alone {dec_alone:.0f} img/s; beside the model: decoder {d:.0f} ({d / dec_alone:.2f}), "
              f"model {m:.0f} ({m / alone:.2f})", flush=True)
    info = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, torchvision=torchvision.__version__,
                batch_size=a.batch_size, seconds=a.seconds)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(info=info, rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
