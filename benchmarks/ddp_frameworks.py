"""Lightning and Accelerate on several GPUs, fed by gputransforms: what each rank saw (side by side
with torch's DataLoader, tests/frameworks/*.py with one GPU per rank) and Lightning's images/s on N
GPUs against one. Run on a multi-GPU machine with DALI installed:

    python -m benchmarks.ddp_frameworks DATA [--gpus 2] [--out bench-out/ddp]

DATA is an ImageFolder for the timing (written with --make-data N if missing).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def torchrun(n, script, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--master_addr=127.0.0.1",
           "--master_port=29533", str(ROOT / "tests" / "frameworks" / script), *map(str, args)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # keep where DALI is
    res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True)
    if res.returncode:
        sys.exit(res.stdout[-2000:] + res.stderr[-4000:])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--make-data", type=int, default=0)
    ap.add_argument("--out", default="bench-out/ddp")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU (a check of this script, no figures)")
    ap.add_argument("--timing-only", action="store_true")
    a = ap.parse_args(argv)
    from gputransforms import sampledata

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.make_data and not Path(a.data).exists():
        from benchmarks.common import make_data

        make_data(a.data, a.make_data)
    idx = sampledata.make_indexed_folder(out / "indexed")
    n = 37
    report = {}
    accel = "cpu" if a.cpu else "gpu"
    if a.timing_only:
        return _timing(a, idx, out, accel, report)
    torchrun(a.gpus, "lightning_ddp.py", idx, out, "--accelerator", accel)
    ranks = [json.loads((out / f"lightning-rank{r}.json").read_text()) for r in range(a.gpus)]
    for case in ("fit-shuffle1-drop0", "fit-shuffle1-drop1", "eval", "fabric", "resume-rest"):
        ours = [r[f"ours/{case}"] for r in ranks]
        same = ours == [r[f"torch/{case}"] for r in ranks]
        counts = {k: [len(r.get(k, [])) for r in ours] for k in sorted(ours[0])}
        union = {k: sorted(Counter(i for r in ours for i, _ in r.get(k, [])).items()) for k in counts}
        report[f"lightning/{case}"] = dict(per_rank=counts, same_as_torch=same,
                                           every_sample=all({i for i, _ in u} >= set(range(n)) or "drop1" in case
                                                            or "resume" in case for u in union.values()))
    report["lightning/resume-exact"] = all(  # head + resumed rest == the uninterrupted epochs, per rank
        r["ours/resume-head"]["fit/0"] + r["ours/resume-rest"].get("fit/0", []) == r["ours/fit-shuffle1-drop0"]["fit/0"]
        and r["ours/resume-rest"]["fit/1"] == r["ours/fit-shuffle1-drop0"]["fit/1"] for r in ranks)
    report["lightning/devices"] = [r["ours/devices"] for r in ranks]
    report["lightning/backend"] = [r["ours/backend"] for r in ranks]
    torchrun(a.gpus, "accelerate_ddp.py", idx, out, *([] if a.cpu else ["--gpu"]))
    ranks = [json.loads((out / f"accelerate-rank{r}.json").read_text()) for r in range(a.gpus)]
    report["accelerate/backend"] = [r["ours/backend"] for r in ranks]
    for case in ("default/shuffle1-drop0", "split_batches/shuffle1-drop0", "uneven/shuffle0-drop0"):
        ours = [r[f"ours/{case}"] for r in ranks]
        report[f"accelerate/{case}"] = dict(per_rank=[[len(e) for e in r] for r in ours],
                                            same_as_torch=ours == [r[f"torch/{case}"] for r in ranks],
                                            iterates=ranks[0][f"ours/{case}/iterates"],
                                            devices=[r[f"ours/{case}/devices"] for r in ranks])
    _timing(a, idx, out, accel, report)


def _timing(a, idx, out, accel, report):
    for g in sorted({1, a.gpus}):
        d = out / f"timing{g}"
        d.mkdir(exist_ok=True)
        torchrun(g, "lightning_ddp.py", idx, d, "--accelerator", accel, "--devices", g, "--timing-data", a.data,
                 "--timing-only")
        t = [json.loads((d / f"lightning-rank{r}.json").read_text())["timing"] for r in range(g)]
        report[f"timing/{g}gpu"] = dict(per_rank_img_s=[round(x["img_s"]) for x in t],
                                        aggregate_img_s=round(sum(x["img_s"] for x in t)),
                                        devices=[x["devices"] for x in t], epoch_images_per_rank=t[0]["epoch_images"],
                                        backend=[x["backend"] for x in t])
    one, many = report["timing/1gpu"]["aggregate_img_s"], report[f"timing/{a.gpus}gpu"]["aggregate_img_s"]
    report["timing/speedup"] = round(many / one, 2)
    (out / "ddp_frameworks.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
