"""webdataset pipelines, side by side with torch's DataLoader over the same pipeline (#36): the same
samples and labels, pixels within the image path's parity, every sample once per epoch and rank,
resume, bad members named or skipped, and what does not compile falls back naming the stage."""
from __future__ import annotations

import collections
import concurrent.futures
import warnings

import pytest
import torch
import torch.utils.data as tud

from gputransforms import DataLoader, FallbackWarning, sampledata
from gputransforms import transforms as T
from gputransforms.errors import BadSampleError, SkippedSamplesWarning

wds = pytest.importorskip("webdataset")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]
TF = T.Compose([T.Resize((64, 64)), T.ToTensor()])
NORM = T.Compose([T.Resize(72), T.CenterCrop(64), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])


@pytest.fixture(scope="module")
def shards(photo_folder, tmp_path_factory):
    """photo_folder's 48 real photos in 4 shards of 12, in class order: the brace pattern."""
    out = tmp_path_factory.mktemp("shards")
    paths = sampledata.write_shards(photo_folder, out, per_shard=12)
    assert len(paths) == 4
    return str(out / "shard-{000000..000003}.tar"), paths


def pipeline(url, tf=TF, **kw):
    return wds.WebDataset(url, shardshuffle=kw.pop("shardshuffle", False), **kw).decode("pil") \
        .to_tuple("jpg;png", "cls").map_tuple(tf, lambda y: y)


def torch_epoch(ds, batch_size=8):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [(x, y) for x, y in tud.DataLoader(ds, batch_size=batch_size)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chain", ["resize", "normalize"])
def test_same_samples_labels_and_pixels_as_torch(shards, device, chain):
    tf = TF if chain == "resize" else NORM
    ds = pipeline(shards[0], tf)
    loader = DataLoader(ds, batch_size=8, device=device)
    assert loader.backend == "dali", loader.reason
    ours, theirs = list(loader), torch_epoch(ds)
    assert [len(y) for _, y in ours] == [len(y) for _, y in theirs] == [8] * 6
    scale = 255 if chain == "resize" else 255 * 0.25
    for (x, y), (xt, yt) in zip(ours, theirs):  # no shuffle: webdataset's own order, batch by batch
        assert y.tolist() == yt.tolist() and y.dtype == yt.dtype
        d = ((x.cpu() - xt).abs() * scale)
        assert d.mean() < (0.5 if device == "cpu" else 1.5), d.mean()  # the decoders' difference
    assert "webdataset shard(s)" in loader.explain()


def test_map_dict_and_pilrgb_compile(shards):
    ds = wds.WebDataset(shards[0], shardshuffle=False).decode("pilrgb").map_dict(jpg=TF).to_tuple("jpg", "cls")
    loader = DataLoader(ds, batch_size=8, device="cpu")
    assert loader.backend == "dali", loader.reason
    assert torch.cat([y for _, y in loader]).tolist() == torch.cat([y for _, y in torch_epoch(ds)]).tolist()


def test_shuffled_every_sample_once_and_seeded(shards):
    ds = pipeline(shards[0], shardshuffle=4).shuffle(100)
    g = torch.Generator().manual_seed(3)
    loader = DataLoader(ds, batch_size=8, device="cpu", generator=g)
    everything = sorted(torch.cat([y for _, y in torch_epoch(pipeline(shards[0]))]).tolist())
    epochs = [torch.cat([y for _, y in loader]) for _ in range(2)]
    for e in epochs:
        assert sorted(e.tolist()) == everything
    first = [x for x, _ in DataLoader(ds, batch_size=8, device="cpu", generator=torch.Generator().manual_seed(3))]
    again = [x for x, _ in DataLoader(ds, batch_size=8, device="cpu", generator=torch.Generator().manual_seed(3))]
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # a seed fixes the order
    # order differs between epochs: 48 samples in 3 classes
    assert epochs[0].tolist() != epochs[1].tolist()


def test_ranks_read_their_own_shards_exactly_once(shards, monkeypatch):
    """split_by_node gives each rank its shards (webdataset reads RANK/WORLD_SIZE as torchrun sets
    them); together every sample once. The default single_node_only raises under two ranks, as it does."""
    seen = collections.Counter()
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = pipeline(shards[0], nodesplitter=wds.split_by_node)
        loader = DataLoader(ds, batch_size=8, device="cpu")
        ours, theirs = list(loader), torch_epoch(ds)
        assert len(ours) == len(theirs) == 3  # two shards of 12 each
        for (x, y), (xt, yt) in zip(ours, theirs):
            assert y.tolist() == yt.tolist() and ((x - xt).abs() * 255).mean() < 0.5
            seen.update(_identity(xt))
    with pytest.raises(ValueError, match="nodesplitter"):
        DataLoader(pipeline(shards[0]), batch_size=8, device="cpu")
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    everything = collections.Counter(k for x, _ in torch_epoch(pipeline(shards[0])) for k in _identity(x))
    assert seen == everything and len(everything) == 48


def _identity(x):
    """Each image of a batch as a hashable sample of its pixels (the photos all differ)."""
    return [tuple(v.tolist()) for v in x.flatten(1)[:, ::97].mul(255).round().to(torch.int)]


def test_resume_mid_epoch(shards):
    ds = pipeline(shards[0], shardshuffle=4).shuffle(50)
    full = DataLoader(ds, batch_size=8, device="cpu", generator=torch.Generator().manual_seed(5))
    whole = [y for _, y in full]
    first = DataLoader(ds, batch_size=8, device="cpu", generator=torch.Generator().manual_seed(5))
    it = iter(first)
    head = [next(it)[1] for _ in range(2)]
    saved = first.state_dict()
    later = DataLoader(ds, batch_size=8, device="cpu", generator=torch.Generator().manual_seed(99))
    later.load_state_dict(saved)
    rest = [y for _, y in later]
    assert [t.tolist() for t in head + rest] == [t.tolist() for t in whole]


def _damaged_shards(shards, tmp_path):
    """A copy of the shards whose second shard has a garbage .jpg member (same size, junk bytes) and
    whose last shard is cut in the middle of its last image."""
    import shutil
    import tarfile

    out = tmp_path / "bad"
    out.mkdir()
    paths = [shutil.copy(p, out) for p in shards[1]]
    with tarfile.open(paths[1]) as tar:
        victim = [m for m in tar.getmembers() if m.name.endswith(".jpg")][3]
    with open(paths[1], "r+b") as f:
        f.seek(victim.offset_data)
        f.write(b"\x00garbage" * (victim.size // 8))
    with tarfile.open(paths[3]) as tar:
        last = [m for m in tar.getmembers() if m.name.endswith(".jpg")][-1]
    with open(paths[3], "r+b") as f:
        f.truncate(last.offset_data + last.size // 2)
    return str(out / "shard-{000000..000003}.tar"), paths, victim.name, last.name


def test_bad_members_named_or_skipped(shards, tmp_path):
    url, paths, garbage, cut = _damaged_shards(shards, tmp_path)
    with pytest.raises(BadSampleError) as info:
        list(DataLoader(pipeline(url), batch_size=8, device="cpu"))
    assert f"{paths[1]}:{garbage}" in str(info.value)
    loader = DataLoader(pipeline(url), batch_size=8, device="cpu", on_error="skip")
    with pytest.warns(SkippedSamplesWarning):
        n = sum(len(y) for _, y in loader)
    assert n == 46
    assert sorted(e.path for e in loader.skipped) == sorted([f"{paths[1]}:{garbage}", f"{paths[3]}:{cut}"])
    assert "truncated shard" in " ".join(e.reason for e in loader.skipped)


@pytest.mark.parametrize("handler", ["warn_and_continue", "ignore_and_continue"])
def test_the_pipelines_exception_handler_is_mirrored(shards, tmp_path, handler):
    """webdataset's handler= on the stages that meet a bad sample (the tar reader, .decode): one that
    continues skips it, as webdataset does (warn_and_continue with a warning, here once per epoch); the
    same samples and labels as webdataset's own pipeline on torch's DataLoader."""
    url, paths, garbage, cut = _damaged_shards(shards, tmp_path)
    h = getattr(wds, handler)

    def make():
        return wds.WebDataset(url, shardshuffle=False, handler=h).decode("pil", handler=h) \
            .to_tuple("jpg;png", "cls").map_tuple(TF, lambda y: y)

    loader = DataLoader(make(), batch_size=8, device="cpu")
    assert loader.backend == "dali", loader.reason
    assert f"{handler} handler" in loader.explain()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = sorted(y for _, ys in loader for y in ys.tolist())
    skipped = [w for w in caught if issubclass(w.category, SkippedSamplesWarning)]
    assert len(skipped) == (1 if handler == "warn_and_continue" else 0)
    assert sorted(e.path for e in loader.skipped) == sorted([f"{paths[1]}:{garbage}", f"{paths[3]}:{cut}"])
    theirs = sorted(y for _, ys in torch_epoch(make()) for y in ys.tolist())
    assert ours == theirs and len(ours) == 46


def test_a_handler_of_the_users_own_falls_back(shards):
    def log_and_continue(exn):
        return True

    ds = wds.WebDataset(shards[0], shardshuffle=False).decode("pil", handler=log_and_continue) \
        .to_tuple("jpg;png", "cls").map_tuple(TF, lambda y: y)
    with pytest.warns(FallbackWarning, match="handler=log_and_continue"):
        loader = DataLoader(ds, batch_size=8, device="cpu")
    assert loader.backend == "torchvision"


@pytest.mark.parametrize("make, stage", [
    (lambda url: pipeline(url).batched(4), "batched"),
    (lambda url: wds.WebDataset(url, shardshuffle=False).decode("torchrgb").to_tuple("jpg", "cls"), "torchrgb"),
    (lambda url: wds.WebDataset(f"pipe:cat {url}", shardshuffle=False).decode("pil").to_tuple("jpg", "cls")
     .map_tuple(TF, lambda y: y), "pipe:"),
])
def test_other_pipelines_fall_back_naming_the_stage(shards, make, stage):
    url = shards[1][0] if stage == "pipe:" else shards[0]
    ds = make(url)
    with pytest.warns(FallbackWarning, match="webdataset") as caught:
        loader = DataLoader(ds, batch_size=8, device="cpu")
    assert loader.backend == "torchvision"
    assert stage in str(caught[0].message) and "to compile it" in str(caught[0].message)
    assert "iterable dataset" in loader.explain()


def test_shards_through_fsspec_urls(shards):
    """Shards named by URL are read through fsspec (s3://, gs://, https:// with its plugins; here its
    in-memory filesystem): the same batches as the local files give torch's DataLoader."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for p in shards[1]:
        fs.pipe(f"/gt-shards/{p.rsplit('/', 1)[1]}", open(p, "rb").read())
    urls = [f"memory://gt-shards/shard-{k:06d}.tar" for k in range(4)]
    ours = list(DataLoader(pipeline(urls), batch_size=8, device="cpu"))
    theirs = torch_epoch(pipeline(shards[0]))
    assert len(ours) == len(theirs) == 6
    for (x, y), (xt, yt) in zip(ours, theirs):
        assert y.tolist() == yt.tolist() and ((x - xt).abs() * 255).mean() < 0.5
    assert "memory://gt-shards/shard-000001.tar:" in DataLoader(pipeline(urls), batch_size=8, device="cpu") \
        ._backend.files.paths[12]


def test_the_same_stages_in_a_data_pipeline_compile(shards):
    ds = wds.DataPipeline(wds.SimpleShardList(shards[1]), wds.split_by_worker, wds.tarfile_to_samples(),
                          wds.decode("pil"), wds.to_tuple("jpg;png", "cls"), wds.map_tuple(TF, lambda y: y))
    loader = DataLoader(ds, batch_size=8, device="cpu")
    assert loader.backend == "dali", loader.reason
    for (x, y), (xt, yt) in zip(loader, torch_epoch(ds)):
        assert y.tolist() == yt.tolist() and ((x - xt).abs() * 255).mean() < 0.5


def test_the_loader_keeps_a_few_shards_open(shards):
    """A shuffled epoch jumps between shards: the reader threads share the most recent few descriptors,
    not every shard read (thousands of shards would exhaust them), and each read gives the member's bytes
    whichever shard was open before."""
    loader = DataLoader(pipeline(shards[0], shardshuffle=4).shuffle(100), batch_size=8, device="cpu")
    samples = loader._backend.files
    samples._descriptors.KEEP = 2
    first = [i for i, (shard, _, _) in enumerate(samples.members) if i == 0 or samples.members[i - 1][0] != shard]
    assert len(first) == 4
    expected = {}
    for i in first:
        shard, offset, size = samples.members[i]
        with open(samples.shards[shard], "rb") as f:
            f.seek(offset)
            expected[i] = f.read(size)
    for i in first * 3:  # the first sample of each of the four shards, three times over
        assert samples.read(i) == expected[i]
        assert len(samples._descriptors.open) <= 2
    assert len(samples._descriptors.open) == 2
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # threads share the descriptors
        got = list(pool.map(samples.read, first * 25))
    assert got == [expected[i] for i in first * 25] and len(samples._descriptors.open) <= 2


def test_shards_on_an_s3_server(shards, monkeypatch):
    """Shards named by s3:// URLs, read from a real S3-compatible server running on this machine
    (moto's), configured as fsspec users configure s3fs (``fsspec.config.conf["s3"]``, or the
    ``FSSPEC_S3_*`` environment variables): the same batches as the local files give torch's
    DataLoader, and a member is named by its URL."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    import fsspec

    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = dict(endpoint_url=f"http://{host}:{port}", key="testing", secret="testing")
        monkeypatch.setitem(fsspec.config.conf, "s3", options)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir("gt-shards")
        for p in shards[1]:
            fs.put(p, f"gt-shards/{p.rsplit('/', 1)[1]}")
        urls = [f"s3://gt-shards/shard-{k:06d}.tar" for k in range(4)]
        loader = DataLoader(pipeline(urls), batch_size=8, device="cpu")
        assert loader.backend == "dali", loader.reason
        ours = list(loader)
        theirs = torch_epoch(pipeline(shards[0]))
        assert len(ours) == len(theirs) == 6
        for (x, y), (xt, yt) in zip(ours, theirs):
            assert y.tolist() == yt.tolist() and ((x - xt).abs() * 255).mean() < 0.5
        assert loader._backend.files.paths[12].startswith("s3://gt-shards/shard-000001.tar:")
    finally:
        server.stop()
