"""Inside the training frameworks users already have, side by side with torch's DataLoader: the same
script, 2 processes under torchrun (gloo on the CPU), only the DataLoader class swapped
(tests/frameworks/*.py). The pixels name the samples, so every check is on what each rank saw."""
import json
import os
import socket
import subprocess
import sys
from collections import Counter

import pytest

from conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script, *args, timeout=300, check=True):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}",
           str(ROOT / "tests" / "frameworks" / script), *map(str, args)]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert res.returncode == 0 or not check, res.stdout[-3000:] + res.stderr[-5000:]
    return res


@pytest.fixture(scope="module")
def lightning_run(indexed_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning")
    res = torchrun("lightning_ddp.py", indexed_folder, out)
    ranks = [json.loads((out / f"lightning-rank{r}.json").read_text()) for r in (0, 1)]
    return ranks, res.stderr


def per_epoch(ranks, key):
    """{stage/epoch: [rank0 samples, rank1 samples]}"""
    epochs = sorted(set(ranks[0][key]) | set(ranks[1][key]))
    return {e: [[tuple(s) for s in r[key].get(e, [])] for r in ranks] for e in epochs}


N = 37  # indexed_folder


@pytest.mark.parametrize("case", ["fit-shuffle1-drop0", "fit-shuffle0-drop0", "fit-shuffle1-drop1"])
def test_lightning_ddp_injects_the_distributed_sampler_into_ours(lightning_run, case):
    ranks, _ = lightning_run
    ours, theirs = per_epoch(ranks, f"ours/{case}"), per_epoch(ranks, f"torch/{case}")
    assert ours == theirs, "the same samples on the same ranks as torch's DataLoader"
    assert sorted(ours) == ["fit/0", "fit/1"]
    for epoch, (r0, r1) in ours.items():
        seen = Counter(i for i, _ in r0 + r1)
        if case.endswith("drop1"):
            assert len(r0) == len(r1) == 16 and max(seen.values()) == 1
        else:  # DistributedSampler pads 37 to 38 with one repeated sample
            assert len(r0) == len(r1) == 19 and set(seen) == set(range(N)) and sum(seen.values()) == 38
    if "shuffle1" in case:
        assert ours["fit/0"] != ours["fit/1"], "set_epoch reached the sampler"


def test_lightning_without_injection_and_with_limits(lightning_run):
    ranks, stderr = lightning_run
    for case in ("fit-no-injection", "fit-limit2", "fit-overfit2", "eval"):
        assert per_epoch(ranks, f"ours/{case}") == per_epoch(ranks, f"torch/{case}"), case
    no_injection = per_epoch(ranks, "ours/fit-no-injection")["fit/0"]
    assert all(sorted(i for i, _ in r) == list(range(N)) for r in no_injection)  # what the user asked for
    assert "rank 0 gets every sample of every epoch" in stderr, "and the user is told"
    assert [len(r) for r in per_epoch(ranks, "ours/fit-limit2")["fit/0"]] == [8, 8]
    evaluated = per_epoch(ranks, "ours/eval")
    assert set(evaluated) == {"validate/0", "test/0", "predict/0"}
    for stage, (r0, r1) in evaluated.items():
        assert set(i for i, _ in r0 + r1) == set(range(N)), stage
    assert ranks[0]["ours/devices"] == ["cpu"]
    assert ranks[0]["ours/backend"] == ranks[1]["ours/backend"] == "dali", "compiled in the ranks' processes"


def test_lightning_fabric_setup_dataloaders(lightning_run):
    ranks, _ = lightning_run
    ours, theirs = per_epoch(ranks, "ours/fabric"), per_epoch(ranks, "torch/fabric")
    assert ours == theirs and sorted(ours) == ["fabric/0", "fabric/1"]
    for r0, r1 in ours.values():
        assert len(r0) == len(r1) == 19 and set(i for i, _ in r0 + r1) == set(range(N))
    assert ranks[0]["ours/fabric-class"] == "gputransforms.loader"


def test_lightning_mid_epoch_resume_through_its_checkpoint(lightning_run):
    ranks, _ = lightning_run
    full = per_epoch(ranks, "ours/fit-shuffle1-drop0")
    head = per_epoch(ranks, "ours/resume-head")["fit/0"]
    rest = per_epoch(ranks, "ours/resume-rest")
    for r in (0, 1):
        assert len(head[r]) == 8  # two steps of 4
        assert head[r] + rest.get("fit/0", [[], []])[r] == full["fit/0"][r], "the epoch goes on where it stopped"
        assert rest["fit/1"][r] == full["fit/1"][r], "and the next epoch is the uninterrupted run's"


@pytest.fixture(scope="module")
def accelerate_run(indexed_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerate")
    torchrun("accelerate_ddp.py", indexed_folder, out)
    return [json.loads((out / f"accelerate-rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("config", ["default", "split_batches", "uneven"])
@pytest.mark.parametrize("case", ["shuffle1-drop0", "shuffle0-drop0", "shuffle1-drop1"])
def test_accelerate_prepare_shards_ours_and_keeps_it_compiled(accelerate_run, config, case):
    ranks = accelerate_run
    key = f"{config}/{case}"
    ours, theirs = [r[f"ours/{key}"] for r in ranks], [r[f"torch/{key}"] for r in ranks]
    assert ours == theirs, "the same samples on the same ranks, epoch after epoch, as torch's DataLoader"
    assert all(r[f"ours/{key}/iterates"] == "gputransforms.loader" for r in ranks), "prepare() kept our loader"
    for e in range(2):
        seen = Counter(i for r in ours for i, _ in r[e])
        if case.endswith("drop1"):
            assert max(seen.values()) == 1
        else:
            assert set(seen) == set(range(N)), "every sample reaches some rank"
            assert sum(seen.values()) - N <= (3 if config != "uneven" else 0), "only even_batches' padding repeats"
        # indexed_folder's classes hold files 0-12, 13-24 and 25-36: the label follows the pixels
        assert all(lab == (0 if i < 13 else 1 if i < 25 else 2) for r in ours for i, lab in r[e])


def test_accelerate_skip_first_batches(accelerate_run):
    ranks = accelerate_run
    assert all(r["ours/backend"] == "dali" for r in ranks), "compiled in the ranks' processes"
    ours, theirs = [r["ours/skip2"] for r in ranks], [r["torch/skip2"] for r in ranks]
    full = [r["ours/default/shuffle0-drop0"][0] for r in ranks]
    assert ours == theirs
    for r in (0, 1):
        assert [tuple(s) for s in ours[r]] == [tuple(s) for s in full[r][8:]], "two batches of 4 skipped"


def test_accelerate_mid_epoch_resume_with_save_state_and_skip_first_batches(accelerate_run):
    """Accelerate's own recipe (use_seedable_sampler, save_state after 2 batches, then load_state
    and skip_first_batches(2)): the rest of the epoch and the next one are the uninterrupted run's,
    for ours as for torch's. (Our loader once scanned Accelerate's SkipBatchSampler for its batch
    size, which advanced the SeedableRandomSampler's epoch.)"""
    for r in accelerate_run:
        for kind in ("ours", "torch"):
            d = r[f"{kind}/resume"]
            assert len(d["head"]) == 8 and d["head"] + d["rest"] == d["full"][0], kind
            assert d["next"] == d["full"][1], kind


# --- docs/training.md's torchrun recipe: plain torch.distributed, DistributedSampler + set_epoch -----------

@pytest.fixture(scope="module")
def torchrun_run(indexed_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("torchrun")
    torchrun("torchrun_ddp.py", indexed_folder, out)
    return [json.loads((out / f"torchrun-rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("case", ["shuffle1-drop0", "shuffle0-drop0", "shuffle1-drop1", "shuffle0-drop1"])
def test_torchrun_recipe_shards_as_torchs_dataloader(torchrun_run, case):
    ranks = torchrun_run
    for e in (0, 1):
        ours = [[tuple(s) for s in r[f"ours/{case}/{e}"]] for r in ranks]
        assert ours == [[tuple(s) for s in r[f"torch/{case}/{e}"]] for r in ranks], "torch's samples, rank by rank"
        seen = Counter(i for r in ours for i, _ in r)
        if case.endswith("drop1"):  # the sampler drops 37 to 36 (18 a rank), the loader the last 2
            assert [len(r) for r in ours] == [16, 16] and max(seen.values()) == 1
        else:  # the sampler pads 37 to 38 with one repeated sample; the last batch is partial
            assert [len(r) for r in ours] == [19, 19] and set(seen) == set(range(N)) and sum(seen.values()) == 38
        assert all(lab == (0 if i < 13 else 1 if i < 25 else 2) for r in ours for i, lab in r)
    if case.startswith("shuffle1"):
        assert ranks[0][f"ours/{case}/0"] != ranks[0][f"ours/{case}/1"], "set_epoch reached the sampler"


def test_torchrun_recipe_resumes_each_rank_mid_epoch(torchrun_run):
    for r in torchrun_run:
        head, rest = r["ours/resume"]
        assert len(head) == 8 and head + rest == r["ours/shuffle1-drop0/1"], "batch 3 of epoch 1 follows"
        assert r["ours/resume"] == r["torch/resume"]
        assert r["ours/state-bytes"] < 32768, "no image data: two CPU RNG states (5 KiB each), DALI's checkpoint, counters"
    assert torchrun_run[0]["ours/resume"] != torchrun_run[1]["ours/resume"], "each rank its own shard"


def test_a_failing_rank_is_named_and_ends_the_job(indexed_folder, tmp_path):
    """Rank 1 meets a corrupt file while rank 0 waits in a collective: the error names the rank and
    the file, and the job ends (torchrun stops rank 0 when rank 1 exits) instead of hanging."""
    import shutil
    import time

    data = tmp_path / "data"
    shutil.copytree(indexed_folder, data)
    bad = sorted(data.glob("class0/*.jpg"))[3]  # sample 3: rank 1's second sample
    bad.write_bytes(bad.read_bytes()[:200])
    start = time.monotonic()
    res = torchrun("torchrun_ddp.py", data, tmp_path, "--fail", timeout=240, check=False)
    took = time.monotonic() - start
    assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert f"[rank 1 of 2] gputransforms: sample 3 ({bad})" in res.stderr, res.stderr[-3000:]
    assert "rank 1: finished" not in res.stdout
    assert took < 120, f"the job took {took:.0f} s to end"


# --- webdataset shards under torchrun: each rank its own shards (#36) -------------------------------------

def test_webdataset_ranks_read_their_shards_exactly_once(indexed_folder, tmp_path):
    """Two gloo ranks, split_by_node: each rank's samples are torch's DataLoader's over the same pipeline,
    in each of two epochs, and together every sample exactly once (4 shards of 10, 10, 10, 7)."""
    pytest.importorskip("webdataset")
    from gputransforms import sampledata

    sampledata.write_shards(indexed_folder, tmp_path / "shards", per_shard=10)
    torchrun("torchrun_wds.py", tmp_path / "shards" / "shard-{000000..000003}.tar", tmp_path)
    ranks = [json.loads((tmp_path / f"wds-rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["backend"] for r in ranks] == ["dali", "dali"]
    for r in ranks:
        assert r["ours"][0] == r["ours"][1] == r["torch"]
    assert [len(r["torch"]) for r in ranks] == [20, 17]
    seen = Counter(i for r in ranks for i, _ in r["ours"][0])
    assert set(seen) == set(range(N)) and max(seen.values()) == 1
    assert all(lab == (0 if i < 13 else 1 if i < 25 else 2) for r in ranks for i, lab in r["ours"][0])
