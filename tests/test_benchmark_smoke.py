"""The benchmark runs end to end on a tiny folder (timings are not checked: they belong to
benchmarks, not tests), so it cannot rot."""
import json
import subprocess
import sys

from conftest import ROOT


def test_loader_benchmark_runs(indexed_folder, tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "benchmarks.loader", str(indexed_folder), "--batch-size", "8", "--images", "16",
           "--workers", "1", "--threads", "1", "--chains", "train,eval,simclr",
           "--pipelines", "torchvision,dali-handwritten,gputransforms", "--out", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "loader.json").read_text())
    rows = {(r["chain"], r["pipeline"]): r for r in report["rows"]}
    assert set(rows) == {(c, p) for c in ("train", "eval", "simclr") for p in ("torchvision", "dali-handwritten", "gputransforms")}
    for r in rows.values():
        assert "error" not in r, r
        assert r["img_s"] > 0 and r["ttfb_s"] > 0 and r["shape"][1:] == [3, 224, 224]
    assert (out / "loader.png").stat().st_size > 1000
    assert "gputransforms" in res.stdout and "img/s" in res.stdout


def test_train_benchmark_runs(indexed_folder, tmp_path):
    out = tmp_path / "train"
    cmd = [sys.executable, "-m", "benchmarks.train", str(indexed_folder), "--models", "mobilenet_v3_small", "--chains", "train",
           "--feeds", "model,dali-handwritten,gputransforms,torchvision", "--batch-size", "4", "--images", "8",
           "--warmup", "1", "--workers", "1", "--threads", "1", "--out", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["feed"]: r for r in json.loads((out / "train.json").read_text())["rows"]}
    assert set(rows) == {"model", "dali-handwritten", "gputransforms", "torchvision"}
    for r in rows.values():
        assert "error" not in r, r
        assert r["img_s"] > 0 and r["images"] >= 8 and 0 < r["of_model"]
    assert rows["model"]["of_model"] == 1.0


def test_gpu_time_benchmark_runs(indexed_folder, tmp_path):
    out = tmp_path / "gpu_time"
    cmd = [sys.executable, "-m", "benchmarks.gpu_time", str(indexed_folder), "--chains", "simclr", "--batches", "2",
           "--warmup", "1", "--batch-size", "8", "--threads", "1", "--out", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["pipeline"]: r for r in json.loads((out / "gpu_time.json").read_text())["rows"]}
    assert set(rows) == {"dali-handwritten", "gputransforms"}
    assert all(r["wall_ms"] > 0 and r["cpu_cores"] > 0 for r in rows.values())
    assert rows["gputransforms"]["tail_ms"] > 0 and rows["dali-handwritten"]["tail_ms"] == 0  # simclr's jitter is in the tail
