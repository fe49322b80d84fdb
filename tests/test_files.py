"""Odd and bad files: odd images come out as torchvision's loader makes them; bad ones raise an
error naming the file and sample index from the loop (or are skipped and reported); nothing is
lost and no label moves."""
import re
import shutil

import pytest
import torch
import torchvision
from PIL import Image, ImageFile

from gputransforms import BadSampleError, DamagedFileWarning, DataLoader, SkippedSamplesWarning, datasets, sampledata
from gputransforms import transforms as T

from conftest import DEVICES, abs_diff_stats, make_photo_folder

RAW = T.Compose([T.PILToTensor()])


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory):
    return make_photo_folder(tmp_path_factory.mktemp("odd"), classes=1, per_class=2, seed=3, odd=True)


# nvJPEG's IDCT/colour conversion differ from libjpeg-turbo's (see test_parity); PNG/BMP/TIFF/WEBP
# and everything PIL decodes for DALI (16-bit PNG, truncated JPEGs) must be exact on both. On the
# GPU the difference is nvJPEG's default chroma upsampling: measured on the H100, 0.0 for the 4:4:4
# copy of the odd files' photo and 1.50 mean for its 4:2:0 copies (saturated colour edges), 0.45-0.93
# for the ordinary photos; jpeg_fancy_upsampling=True removes it (next test).
ODD_TOL = {"cpu": 0.05, "gpu": 2.0}


@pytest.mark.parametrize("device", DEVICES)
def test_odd_images_decode_like_torchvision(odd_folder, device):
    ds = datasets.ImageFolder(str(odd_folder), transform=RAW)
    ref = torchvision.datasets.ImageFolder(str(odd_folder), transform=RAW)
    names = [p.split("/")[-1] for p, _ in ds.samples]
    assert {"cmyk.jpg", "gray16.png", "exif_rot90.jpg", "huge_6000x4000.jpg", "one_pixel.jpg", "upper.JPG",
            "plain.webp", "palette.png"} <= set(names)
    worst, bad = {}, []
    for i, (x, y) in enumerate(DataLoader(ds, batch_size=1, device=device)):
        r = ref[i][0]
        if x[0].shape != r.shape:
            bad.append((names[i], tuple(x[0].shape), tuple(r.shape)))
            continue
        stats = abs_diff_stats(x[0], r)
        worst[names[i]] = round(stats["mean"], 3)
        # PIL decodes CMYK JPEGs for DALI, and on the GPU JPEGs with a side under 64 px
        pil_decoded = names[i] in ("cmyk.jpg",) + (("tiny_7x5.jpg", "one_pixel.jpg", "strip_4000x50.jpg")
                                                   if device == "gpu" else ())
        lossless = not names[i].lower().endswith((".jpg", ".jpeg")) or pil_decoded
        if stats["mean"] > (0.0 if lossless else ODD_TOL[device]):
            bad.append((names[i], stats))
    print(f"\nodd files [{device}] mean |diff|: {worst}")
    assert not bad, bad


@pytest.mark.gpu
def test_odd_jpegs_with_fancy_upsampling_decode_like_pil_on_the_gpu(odd_folder):
    ds = datasets.ImageFolder(str(odd_folder), transform=RAW)
    ref = torchvision.datasets.ImageFolder(str(odd_folder), transform=RAW)
    worst = {}
    for i, (x, _) in enumerate(DataLoader(ds, batch_size=1, device="gpu", jpeg_fancy_upsampling=True)):
        worst[ds.samples[i][0].split("/")[-1]] = round(abs_diff_stats(x[0], ref[i][0])["mean"], 3)
    print(f"\nodd files [gpu, fancy upsampling] mean |diff|: {worst}")
    assert max(worst.values()) <= 0.5, worst  # nvJPEG's IDCT remains (see test_parity: 0.15 after a resize)


def _bad_folder(tmp_path, photo_folder, kind):
    """Three good photos per class in two classes, plus one bad file in class b."""
    root = tmp_path / kind
    photos = sorted(photo_folder.rglob("*.jpg"))
    for c, start in (("a", 0), ("b", 3)):
        (root / c).mkdir(parents=True)
        for k, p in enumerate(photos[start:start + 3]):
            shutil.copy(p, root / c / f"{k}.jpg")
    bad = root / "b" / "1_bad.jpg"  # sorts between good files: batches before and after it
    good = (root / "b" / "0.jpg").read_bytes()
    if kind.startswith("corrupt-body"):
        sampledata.write_bad_file(bad, "corrupt-body", good, seed=int(kind.rsplit("-", 1)[1]))
    elif kind in ("disappears", "unreadable"):
        bad.write_bytes(good)
    else:
        sampledata.write_bad_file(bad, kind, good)
    return root, bad


def _break_after_listing(kind, bad):
    if kind == "disappears":
        bad.unlink()
    elif kind == "unreadable":  # root can read any file: a directory where the file was cannot be read
        bad.unlink()
        bad.mkdir()


BAD_KINDS = ["empty", "garbage", "not-an-image", "truncated", "disappears", "unreadable"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_file_raises_naming_it(tmp_path, photo_folder, device, kind):
    root, bad = _bad_folder(tmp_path, photo_folder, kind)
    ds = datasets.ImageFolder(str(root), transform=T.Compose([T.Resize((32, 32)), T.ToTensor()]))
    index = [p for p, _ in ds.samples].index(str(bad))
    _break_after_listing(kind, bad)
    loader = DataLoader(ds, batch_size=2, device=device)
    seen = []
    with pytest.raises(BadSampleError) as info:
        for x, y in loader:
            seen += y.tolist()
    assert str(bad) in str(info.value) and f"sample {index}" in str(info.value)
    assert info.value.index == index
    assert len(seen) == index // 2 * 2, "the batches before the bad one arrive first"
    # the loader is still usable: the next epoch raises the same way, it does not hang
    with pytest.raises(BadSampleError):
        list(loader)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_file_skipped_and_reported(tmp_path, photo_folder, device, kind):
    root, bad = _bad_folder(tmp_path, photo_folder, kind)
    tf = T.Compose([T.Resize((32, 32)), T.ToTensor()])
    ds = datasets.ImageFolder(str(root), transform=tf)
    index = [p for p, _ in ds.samples].index(str(bad))
    _break_after_listing(kind, bad)
    loader = DataLoader(ds, batch_size=2, shuffle=True, device=device, on_error="skip")
    for _ in range(2):
        with pytest.warns(SkippedSamplesWarning, match=str(bad)):
            batches = list(loader)
        labels = torch.cat([y.cpu() for _, y in batches]).tolist()
        images = torch.cat([x.cpu() for x, _ in batches])
        assert [e.index for e in loader.skipped] == [index]
        assert sorted(labels) == sorted(t for i, t in enumerate(ds.targets) if i != index)
        # every image is the right one for its label: compare to torchvision per sample
        ref = {tuple(tf(Image.open(p).convert("RGB")).flatten()[:64].tolist()): t
               for i, (p, t) in enumerate(ds.samples) if i != index}
        for img, lab in zip(images, labels):
            key = min(ref, key=lambda k: (torch.tensor(k) - img.flatten()[:64]).abs().sum())
            assert ref[key] == lab


@pytest.mark.parametrize("device", DEVICES)
def test_truncated_jpeg_follows_pil_load_truncated_images(tmp_path, photo_folder, device, monkeypatch):
    root, bad = _bad_folder(tmp_path, photo_folder, "truncated")
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    ds = datasets.ImageFolder(str(root), transform=RAW)
    index = [p for p, _ in ds.samples].index(str(bad))
    got = [x for x, _ in DataLoader(ds, batch_size=1, device=device)][index][0]
    ref = RAW(Image.open(bad).convert("RGB"))
    assert torch.equal(got.cpu(), ref), "decoded exactly as PIL decodes it (PIL decodes it for DALI)"


@pytest.mark.parametrize("device", DEVICES)
def test_decompression_bomb_guard_is_pils(photo_folder, device, monkeypatch):
    ds = datasets.ImageFolder(str(photo_folder), transform=T.Compose([T.Resize((16, 16)), T.ToTensor()]))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # every photo is now "a bomb" for PIL too
    with pytest.raises(Image.DecompressionBombError):
        ds[0]
    with pytest.raises(BadSampleError, match="MAX_IMAGE_PIXELS"):
        next(iter(DataLoader(ds, batch_size=4, device=device)))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # PIL's way to switch it off
    x, _ = next(iter(DataLoader(ds, batch_size=4, device=device)))
    assert x.shape == (4, 3, 16, 16)


@pytest.mark.parametrize("device", DEVICES)
def test_image_smaller_than_crop_raises_torchvisions_error(odd_folder, device):
    tf = T.Compose([T.RandomCrop(64), T.ToTensor()])
    ds = datasets.ImageFolder(str(odd_folder), transform=tf)
    with pytest.raises(ValueError, match=r"Required crop size \(64, 64\) is larger than input image size") as info:
        list(DataLoader(ds, batch_size=4, device=device))
    assert "one_pixel.jpg" in str(info.value) or "tiny_7x5.jpg" in str(info.value) \
        or "strip_4000x50.jpg" in str(info.value)
    # pad_if_needed pads like torchvision
    padded = T.Compose([T.RandomCrop(64, pad_if_needed=True), T.ToTensor()])
    ds = datasets.ImageFolder(str(odd_folder), transform=padded)
    x = torch.cat([x.cpu() for x, _ in DataLoader(ds, batch_size=4, device=device)])
    assert x.shape == (len(ds), 3, 64, 64)


def test_gpu_out_of_memory_says_what_to_reduce(indexed_folder):
    from gputransforms.datasets.adapters import resolve
    from gputransforms.backends.compiled import name_failure

    samples = resolve(datasets.ImageFolder(str(indexed_folder)))
    err = name_failure(RuntimeError("Critical error in pipeline:\nCUDA allocation failed: out of memory"), [0, 1],
                       samples)
    assert isinstance(err, MemoryError)
    assert "batch_size" in str(err) and "prefetch_factor" in str(err) and "out of memory" in str(err)


def test_jpeg_scan_check_has_no_false_alarms_on_real_photos(photo_folder, odd_folder):
    from gputransforms.files import jpeg_scan_is_valid

    jpegs = [p for root in (photo_folder, odd_folder) for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg")]
    assert len(jpegs) > 50
    assert all(jpeg_scan_is_valid(p.read_bytes()) for p in jpegs)


@pytest.mark.parametrize("device", DEVICES)
def test_corrupted_jpeg_body_follows_pil(tmp_path, photo_folder, device):
    """libjpeg-turbo and nvJPEG decode a corrupted scan to garbage without complaint; PIL raises
    ("broken data stream") or decodes it its own way. With validate_jpeg such files go to PIL: an
    error where PIL errs, PIL's pixels where PIL decodes."""
    outcomes = set()
    for seed in range(6):
        root, bad = _bad_folder(tmp_path / str(seed), photo_folder, f"corrupt-body-{seed}")
        ds = datasets.ImageFolder(str(root), transform=RAW)
        index = [p for p, _ in ds.samples].index(str(bad))
        try:
            expected = RAW(Image.open(bad).convert("RGB"))
        except OSError:
            expected = None
        loader = DataLoader(ds, batch_size=1, device=device, validate_jpeg=True)
        if expected is None:
            outcomes.add("raises")
            with pytest.raises(BadSampleError, match=str(bad)):
                list(loader)
        else:
            outcomes.add("decodes")
            got = [x for x, _ in loader][index][0]
            assert torch.equal(got.cpu(), expected)
    assert outcomes == {"raises", "decodes"}, "the seeds should exercise both of PIL's answers"


def _folder_with_a_stalled_read(tmp_path, photo_folder):
    """A copy of the photos whose 9th file (in ImageFolder order) is a FIFO no one writes: opening it
    blocks, as a read from a stuck network mount does."""
    import os

    root = tmp_path / "stall"
    shutil.copytree(photo_folder, root)
    victim = sorted((root / sorted(p.name for p in root.iterdir())[0]).iterdir())[8]
    victim.unlink()
    os.mkfifo(victim)
    return root, victim


def _release(fifo):
    """Let the blocked reader go (it then reads an empty file)."""
    import os

    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.parametrize("device", DEVICES)
def test_timeout_names_the_sample_whose_read_stalled(tmp_path, photo_folder, device):
    """timeout= means what it means in torch: an error (torch: RuntimeError "DataLoader timed out after
    N seconds") once a batch takes longer than that; here it names the file, after the batches before it."""
    import time

    root, fifo = _folder_with_a_stalled_read(tmp_path, photo_folder)
    loader = DataLoader(datasets.ImageFolder(str(root), transform=T.Compose([T.Resize((32, 32)), T.PILToTensor()])),
                        batch_size=4, timeout=2, device=device)
    got, start = [], time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=rf"timed out after 2 seconds: the read of sample 8 \(.*{fifo.name}\)"):
            for x, _ in loader:
                got.append(len(x))
        assert got == [4, 4] and time.monotonic() - start < 30
    finally:
        _release(fifo)


def test_ctrl_c_ends_a_loader_stuck_in_a_read(tmp_path, photo_folder):
    """After Ctrl-C the process ends promptly though a reader thread is stuck in open() (before: the
    interpreter waited at exit for the thread pool's threads, for ever)."""
    import signal
    import subprocess
    import sys
    import time

    root, fifo = _folder_with_a_stalled_read(tmp_path, photo_folder)
    code = ("import sys, gputransforms as g\n"
            f"ds = g.datasets.ImageFolder({str(root)!r}, transform=g.transforms.Compose("
            "[g.transforms.Resize((32, 32)), g.transforms.PILToTensor()]))\n"
            "loader = g.DataLoader(ds, batch_size=4, device='cpu')\n"
            "print('ready', flush=True)\n"
            "for _ in loader: pass\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(3.0)  # the loop now waits for the batch whose file does not come (DALI prefetches it)
        child.send_signal(signal.SIGINT)
        start = time.monotonic()
        child.wait(timeout=20)
        assert time.monotonic() - start < 5 and "KeyboardInterrupt" in child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
        _release(fifo)


def _damaged_png_and_bmp(root, photo_folder):
    """One PNG or BMP per kind of damage, made from a real photo: (name, bytes)."""
    import struct
    import zlib
    from io import BytesIO

    src = sorted(photo_folder.rglob("*.jpg"))[0]
    img = Image.open(src).convert("RGB").resize((96, 72))
    png = BytesIO()
    img.save(png, format="PNG")
    png = png.getvalue()
    bmp = BytesIO()
    img.save(bmp, format="BMP")
    bmp = bmp.getvalue()
    idat = png.index(b"IDAT") - 4
    bad_idat = bytearray(png)
    (n,) = struct.unpack(">I", png[idat:idat + 4])
    bad_idat[idat + 8 + n] ^= 0xFF  # the first byte of IDAT's CRC
    text = b"tEXtComment\x00hello"
    chunk = struct.pack(">I", len(text) - 4) + text + struct.pack(">I", zlib.crc32(text) ^ 1)
    bad_text = png[:33] + chunk + png[33:]  # after IHDR, with a wrong CRC
    return {"no_iend.png": png[:-12], "cut5.png": png[:-5], "bad_idat_crc.png": bytes(bad_idat),
            "cut_pixels.png": png[:len(png) * 2 // 3], "cut.bmp": bmp[:len(bmp) * 2 // 3],
            "bad_text_crc.png": bad_text}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("truncated_ok", [False, True], ids=["strict", "LOAD_TRUNCATED_IMAGES"])
def test_damaged_png_and_bmp_follow_pil(tmp_path, photo_folder, device, truncated_ok, monkeypatch):
    """libpng (DALI) refuses a PNG whose CRCs or IEND are off, and failed the whole batch unnamed; PIL
    decodes some (torchvision's pixels, a DamagedFileWarning naming the file) and refuses others (a
    BadSampleError naming it, where torchvision raises too), with ImageFile.LOAD_TRUNCATED_IMAGES as PIL
    reads it."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", truncated_ok)
    refused = []
    for name, data in _damaged_png_and_bmp(tmp_path, photo_folder).items():
        root = tmp_path / f"{name}-{truncated_ok}"
        (root / "a").mkdir(parents=True)
        (root / "a" / name).write_bytes(data)
        try:
            ref = torchvision.datasets.ImageFolder(str(root), transform=RAW)[0][0]
        except Exception:  # noqa: BLE001 - torchvision refuses it
            ref = None
        loader = DataLoader(datasets.ImageFolder(str(root), transform=RAW), batch_size=1, device=device)
        if ref is None:
            refused.append(name)
            with pytest.raises(BadSampleError, match=re.escape(name)):
                next(iter(loader))
            continue
        with pytest.warns(DamagedFileWarning, match=rf"{re.escape(name)}\): .*decoded by PIL"):
            x, _ = next(iter(loader))
        assert torch.equal(x[0].cpu(), ref), name
    # PIL's rules: a cut file only with LOAD_TRUNCATED_IMAGES, which also lets a bad text-chunk CRC pass
    assert refused == ([] if truncated_ok else ["cut_pixels.png", "cut.bmp", "bad_text_crc.png"])


@pytest.mark.parametrize("device", DEVICES)
def test_a_file_only_dali_fails_on_is_decoded_by_pil(photo_folder, device, monkeypatch):
    """Whatever DALI cannot decode but PIL can (here: the bytes DALI is handed for one file are made
    undecodable, the file itself is fine) is decoded as torchvision would: the batch's files by PIL,
    a DamagedFileWarning naming them, every sample once and in order, torchvision's pixels."""
    import numpy as np

    from gputransforms import files

    ds = datasets.ImageFolder(str(photo_folder), transform=T.Compose([T.Resize((40, 40)), T.PILToTensor()]))
    victim = ds.samples[5][0]
    prepare = files.prepare

    def refused_by_dali(index, path, **kw):
        return np.frombuffer(b"\xff\xd8\xff\xe0" + b"\x00" * 64, dtype=np.uint8) if path == victim else \
            prepare(index, path, **kw)

    monkeypatch.setattr(files, "prepare", refused_by_dali)
    loader = DataLoader(ds, batch_size=4, device=device)
    with pytest.warns(DamagedFileWarning, match=re.escape(victim)):
        ours = torch.cat([x.cpu() for x, _ in loader])
    ref = torch.stack([torchvision.datasets.ImageFolder(str(photo_folder), transform=ds.transform)[i][0]
                       for i in range(len(ds))])
    # (the graph's Resize against PIL's: test_parity's bounds)
    assert ours.shape == ref.shape and abs_diff_stats(ours, ref)["mean"] <= (0.3 if device == "cpu" else 1.0)
