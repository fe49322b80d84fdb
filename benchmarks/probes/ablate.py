"""Which part of a compiled graph costs what: DALI pipelines alone (pipeline.run(), no torch
hand-off), fed by readers.file so Python is out of the measurement.

    python -m benchmarks.probes.ablate ROOT [--threads 8] [--batch-size 256]
"""
import argparse

import torch
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline

from benchmarks.common import CHAINS, MEAN, STD
from benchmarks.probes.timm_ra import rate as graph_rate


def rate(pipe, n_images, batch_size):
    pipe.build()
    return graph_rate(pipe, n_images, batch_size, warmup=3)[0]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--images", type=int, default=15000)
    a = ap.parse_args(argv)
    bs, dev = a.batch_size, 0 if torch.cuda.is_available() else None
    gpu = dev is not None
    mean, std = [m * 255 for m in MEAN], [s * 255 for s in STD]

    def reader():
        return fn.readers.file(file_root=a.root, random_shuffle=True, name="r")[0]

    def variant(decode_kw, sizes="shorter", crop_pos=False, peek=False):
        p = Pipeline(batch_size=bs, num_threads=a.threads, device_id=dev, seed=1, prefetch_queue_depth=2)
        with p:
            enc = reader()
            kw = dict(device="mixed" if gpu else "cpu", output_type=types.RGB)
            if gpu:
                kw["hw_decoder_load"] = 0.9
            kw.update(decode_kw)
            img = fn.decoders.image(enc, **kw)
            if peek:
                shape = fn.peek_image_shape(enc, adjust_orientation=False, dtype=types.INT32)
            if sizes == "shorter":
                img = fn.resize(img, resize_shorter=256)
            else:
                from gputransforms.compiler.dali import resized_size

                h, w = resized_size(shape[0], shape[1], ("shorter", 256, None))
                img = fn.resize(img, resize_y=fn.cast(h, dtype=types.FLOAT), resize_x=fn.cast(w, dtype=types.FLOAT))
            ckw = dict(crop=(224, 224))
            if crop_pos:
                ckw.update(crop_pos_x=fn.random.uniform(range=[0.4, 0.6]), crop_pos_y=fn.random.uniform(range=[0.4, 0.6]))
            p.set_outputs(fn.crop_mirror_normalize(img, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std,
                                                   **ckw))
        return p

    rows = [
        ("eval hand-written (resize_shorter, crop)", variant({})),
        ("+ adjust_orientation=False", variant(dict(adjust_orientation=False))),
        ("+ jpeg_fancy_upsampling", variant(dict(jpeg_fancy_upsampling=True))),
        ("+ peek_image_shape (unused)", variant({}, peek=True)),
        ("+ exact sizes from peek_image_shape", variant({}, sizes="exact", peek=True)),
        ("+ per-sample crop_pos", variant({}, crop_pos=True)),
    ]
    from gputransforms import plan
    from gputransforms import transforms as T
    from gputransforms.compiler.dali import build_pipeline

    for chain in ("eval", "train"):
        rows.append((f"gputransforms {chain} graph, readers.file fed",
                     build_pipeline(plan(CHAINS[chain](T)), None, device="gpu" if gpu else "cpu", batch_size=bs,
                                    num_threads=a.threads, seed=1, reader=reader)))
    for name, pipe in rows:
        print(f"{name:48} {rate(pipe, a.images, bs):8.0f} img/s", flush=True)
        del pipe


if __name__ == "__main__":
    main()
