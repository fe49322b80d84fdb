"""What one worker process does per sample for a detection preset, on one core (#34):

    python -m benchmarks.probes.detection_read ROOT [--presets ssd,ssdlite,hflip,seg] [--samples 200]

- ``torchvision``: ``dataset[i]`` of torch's DataLoader (PIL decode, the joint transform on the pixels);
- ``recorded``: our recorded read (the file's bytes, its header, torchvision's target, the joint transform on a
  stand-in image, the row of parameters, the pickled target);
- ``recorded, torchvision's IoU draw``: the same with RandomIoUCrop's own ``make_params`` (without the
  registry's exact faster draw).

ms per sample; the ratio of the first to the others bounds our loader against torch's when the workers are the
bottleneck (same number of workers)."""
from __future__ import annotations

import argparse
import time

import torch


def main(argv=None):
    from benchmarks.detection import coco_of, dataset, segmentation, voc_of
    from gputransforms.compiler import joint, registry
    from gputransforms.datasets.detection import resolve_detection

    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--presets", default="ssd,ssdlite,hflip")
    ap.add_argument("--samples", type=int, default=200)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    coco = coco_of(a.root)
    for preset in a.presets.split(","):
        sub = segmentation(voc_of(a.root)) if preset == "seg" else dataset(coco, preset)
        indices = getattr(sub, "indices", range(len(sub)))
        n = min(a.samples, len(sub))
        for i in range(5):
            sub[i]
        t = time.perf_counter()
        for i in range(n):
            sub[i]
        theirs = (time.perf_counter() - t) / n * 1e3
        read = resolve_detection(getattr(sub, "dataset", sub)).reader(gpu=True, check_jpeg_scan=False)
        ours = {}
        for name, keep in (("recorded", True), ("recorded, torchvision's IoU draw", False)):
            saved = dict(registry.REGISTRY)
            if not keep:
                for cls, _ in registry.draws():
                    registry.REGISTRY[cls] = registry.Entry(joint=True)
            try:
                with joint.recording():
                    for i in range(5):
                        read(indices[i])
                    t = time.perf_counter()
                    for i in range(n):
                        read(indices[i])
                    ours[name] = (time.perf_counter() - t) / n * 1e3
            finally:
                registry.REGISTRY.clear()
                registry.REGISTRY.update(saved)
        print(f"{preset}: torchvision {theirs:.2f} ms/sample; " +
              "; ".join(f"{k} {v:.2f} ({theirs / v:.2f}x)" for k, v in ours.items()), flush=True)


if __name__ == "__main__":
    main()
