"""A joint step's pixel work after the graph, in two CUDA kernels over the whole batch (GPU only).

Where a recorded joint transform's structure is the colour block and one window with its flips (no resize:
torchvision's detection preset ``ssd``), the DALI graph only decodes, and these
kernels do the rest for every image of the batch at once, each image at its own size:

- ``gt_joint_means``: the contrast's mean grey, over the whole decoded image, at the point of the colour
  block where the sample's contrast applies (after the brightness; after the saturation and the hue too
  for RandomPhotometricDistort's late contrast). An integer sum of the floored greys per image.
- ``gt_joint_pixels``: each output pixel once -- where its window and flips put it in the source, that
  pixel through the colour block (brightness, contrast, saturation, hue, contrast, channel order), or the
  fill outside the image -- written as CHW uint8, or straight as the loader's float32 (``x * scale +
  shift``, the hand-off's map, ``compiler.handoff``).

What it replaces: in DALI the colour block is about a hundred operators (torchvision's uint8 arithmetic,
each a pass over a float copy of the whole image), run for the whole image before its window is cut, and
each a step of DALI's executor; here each output pixel is read, coloured and written once.

The arithmetic is ``color_kernels``'s (torchvision v2's uint8 kernels as they run on CUDA, rounding
included), applied per pixel in RandomPhotometricDistort's order. The mean is the exact mean of the integer
greys (torch sums them in float32, in its own order: the two can differ in the last bit, as DALI's
reduction did). tests/test_joint_kernels.py runs the same source on the CPU (g++) against torchvision; the
detection tests compare whole presets with torchvision on the GPU.

``ENABLED`` (the environment's ``GPUTRANSFORMS_JOINT_KERNELS``, default on) and a failure to compile send
the joint step back to the graph (``joint_dali``), with one warning for a failure.
"""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from typing import Optional

import numpy as np
import torch

from . import color_kernels
from .joint import COLOUR_WIDTH, STAGE_WIDTH

#: off: the joint step's pixel work stays in the DALI graph (an A/B switch for the benchmarks)
ENABLED = os.environ.get("GPUTRANSFORMS_JOINT_KERNELS", "1") not in ("0", "false", "off")

#: per image: source pointer, height, width; output pointer (``layout``: its offset in elements in one buffer
#: of the batch), height, width; window top, left; horizontal and vertical flip
_META = 10
#: per image, float32: brightness, contrast (early), saturation, hue applied, hue, contrast (late), the 3x3
#: channel matrix, one unused
_COLOUR = 16
_THREADS = 256

_SOURCE = r"""
#define GT_META 10
#define GT_COLOUR 16

// the colour block on one pixel (floats holding uint8 values), in RandomPhotometricDistort's order, up to
// ``upto``: 1 through the brightness (the early contrast's mean), 2 through the hue (the late contrast's
// mean), 3 all of it and the channel order
void gt_joint_colour(float* x, const float* c, float mean1, float mean2, int upto) {
  float r = x[0], g = x[1], b = x[2];
  if (c[0] != 1.0f) gt_jitter_step<float>(r, g, b, 0.0f, c[0], 0.0f, r, g, b);
  if (upto >= 2) {
    if (c[1] != 1.0f) gt_jitter_step<float>(r, g, b, 1.0f, c[1], mean1, r, g, b);
    if (c[2] != 1.0f) gt_jitter_step<float>(r, g, b, 2.0f, c[2], 0.0f, r, g, b);
    if (c[3] != 0.0f) gt_jitter_step<float>(r, g, b, 3.0f, c[4], 0.0f, r, g, b);
  }
  if (upto >= 3) {
    if (c[5] != 1.0f) gt_jitter_step<float>(r, g, b, 1.0f, c[5], mean2, r, g, b);
    const float* m = c + 6;
    x[0] = m[0] * r + m[1] * g + m[2] * b;  // (a permutation: one product is the value, the others 0)
    x[1] = m[3] * r + m[4] * g + m[5] * b;
    x[2] = m[6] * r + m[7] * g + m[8] * b;
    return;
  }
  x[0] = r; x[1] = g; x[2] = b;
}

float gt_joint_mean(unsigned long long sum, long long n) { return (float)((double)sum / (double)n); }

// the pixel at output position p (y * width + x) of image m: 1 and its source values in v, or 0 (the fill)
int gt_joint_source(const long long* m, long long p, float* v) {
  const long long H = m[1], W = m[2], oh = m[4], ow = m[5];
  const long long y = p / ow, x = p - y * ow;
  const long long sy = m[6] + (m[9] ? oh - 1 - y : y);
  const long long sx = m[7] + (m[8] ? ow - 1 - x : x);
  if (sy < 0 || sy >= H || sx < 0 || sx >= W) return 0;
  const unsigned char* px = (const unsigned char*)m[0] + 3 * (sy * W + sx);
  v[0] = px[0]; v[1] = px[1]; v[2] = px[2];
  return 1;
}
"""

_CUDA = r"""
extern "C" __global__ void gt_joint_means(const long long* meta, const float* colour, unsigned long long* sums,
                                          int n, int pass) {
  const int i = blockIdx.y;
  const long long* m = meta + (long long)i * GT_META;
  const float* c = colour + (long long)i * GT_COLOUR;
  if ((pass == 1 ? c[1] : c[5]) == 1.0f) return;  // (the whole block: no __syncthreads is skipped)
  const unsigned char* img = (const unsigned char*)m[0];
  const long long hw = m[1] * m[2];
  const float mean1 = pass == 2 && c[1] != 1.0f ? gt_joint_mean(sums[i], hw) : 0.0f;
  unsigned int acc = 0;
  for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < hw; p += (long long)gridDim.x * blockDim.x) {
    float x[3] = {(float)img[3 * p], (float)img[3 * p + 1], (float)img[3 * p + 2]};
    gt_joint_colour(x, c, mean1, 0.0f, pass);
    acc += (unsigned int)gt_jitter_gray<float>(x[0], x[1], x[2]);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  __shared__ unsigned int part[32];
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    acc = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0u;
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (threadIdx.x == 0) atomicAdd(sums + (pass - 1) * n + i, (unsigned long long)acc);
  }
}

extern "C" __global__ void gt_joint_pixels(const long long* meta, const float* colour, const unsigned long long* sums,
                                           int n, int to_float, double f0, double f1,
                                           double f2, double s0, double s1, double s2, double t0, double t1, double t2) {
  const int i = blockIdx.y;
  const long long* m = meta + (long long)i * GT_META;
  const float* c = colour + (long long)i * GT_COLOUR;
  const long long plane = m[4] * m[5], hw = m[1] * m[2];
  const float mean1 = c[1] != 1.0f ? gt_joint_mean(sums[i], hw) : 0.0f;
  const float mean2 = c[5] != 1.0f ? gt_joint_mean(sums[n + i], hw) : 0.0f;
  const float fill[3] = {(float)f0, (float)f1, (float)f2};
  const float scale[3] = {(float)s0, (float)s1, (float)s2}, shift[3] = {(float)t0, (float)t1, (float)t2};
  for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < plane; p += (long long)gridDim.x * blockDim.x) {
    float v[3];
    if (gt_joint_source(m, p, v)) {
      gt_joint_colour(v, c, mean1, mean2, 3);
    } else {
      v[0] = fill[0]; v[1] = fill[1]; v[2] = fill[2];
    }
    if (to_float) {
      float* o = (float*)m[3];
      for (int k = 0; k < 3; ++k) o[k * plane + p] = __fadd_rn(__fmul_rn(v[k], scale[k]), shift[k]);
    } else {
      unsigned char* o = (unsigned char*)m[3];
      for (int k = 0; k < 3; ++k) o[k * plane + p] = (unsigned char)v[k];
    }
  }
}
"""


def source() -> str:
    """The device functions (color_kernels' step and grey, uint8 and v2, then this module's own), for NVRTC
    (with functions device code by default) and for the tests' host compiler."""
    return (color_kernels.source(color_kernels._STEP, True, True) + color_kernels.source(color_kernels._GRAY, True, True)
            + _SOURCE)


def takes(program) -> bool:
    """Whether these kernels do ``program``'s pixel work: the colour block and one window with its flips, no
    resize. Without the colour block (ssdlite, hflip) the graph's slice and flip stay: the kernels gave those
    presets nothing on an H100 (ssdlite 4,165 / 4,585 / 3,953 img/s in the graph against 4,132 / 3,349 / 3,438,
    hflip 5,219 / 4,938 / 4,512 against 5,234 / 4,152 / 4,207, three alternating rounds), where ssd gained
    16-20% and half its device memory. Nor where a chain resizes first (lsj, multiscale, the segmentation
    preset): the graph decoding and resizing and these kernels cutting the window and flips from the resized
    image ran lsj-v2 5,817 / 5,792 img/s against 5,828 / 6,313 with the graph doing it all, seg 2,927 / 2,779
    against 3,098 / 2,871, multiscale 5,082 against 5,702 (one H100, alternating; round 3, stop 25)."""
    return program.colour and not program.resizes


_LOCK = threading.Lock()
_KERNELS: dict = {}
_BROKEN: list = []


def ready() -> bool:
    """The kernels built for the current device, or False (once warned) where they cannot be: then the
    graph does the joint step's pixels."""
    if not ENABLED or _BROKEN or not torch.cuda.is_available():
        return False
    try:
        _kernels()
        return True
    except Exception as e:  # noqa: BLE001 - NVRTC missing or refusing: the graph's operators still run
        _BROKEN.append(repr(e))
        warnings.warn(f"gputransforms: the joint step's CUDA kernels are unavailable ({e!r}); the DALI graph does "
                      "its colour steps and window (slower, more device memory)", RuntimeWarning, stacklevel=2)
        return False


def _kernels():
    dev = torch.cuda.current_device()
    with _LOCK:
        if dev not in _KERNELS:
            compile_kernel = torch.cuda._compile_kernel
            code = source() + _CUDA
            options = ["-default-device", "--fmad=false"]
            _KERNELS[dev] = tuple(_launcher(compile_kernel(code, name, nvcc_options=options))
                                  for name in ("gt_joint_means", "gt_joint_pixels"))
        return _KERNELS[dev]


def _launcher(kernel):
    """``launch(grid, block, args)`` for a kernel of ``torch.cuda._compile_kernel`` on the current stream, with
    the driver's ``cuLaunchKernel`` looked up once: torch's own call opens libcuda and looks the function up
    again at every launch (8% of the ssd loader's main thread on the H100 host)."""
    try:
        launch, func = ctypes.CDLL("libcuda.so.1").cuLaunchKernel, kernel.func
    except (OSError, AttributeError):  # another driver library or another torch: torch's own call
        return lambda grid, block, args: kernel(grid=grid, block=block, args=args)
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def call(grid: tuple, block: tuple, args: list) -> None:
        c = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else
             ctypes.c_int(a) if isinstance(a, int) else ctypes.c_double(a) for a in args]
        params = (ctypes.c_void_p * len(c))(*[ctypes.addressof(v) for v in c])
        stream = raw_stream(torch.cuda.current_device()) if raw_stream is not None else \
            torch.cuda.current_stream().cuda_stream
        err = launch(func, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, ctypes.c_void_p(stream),
                     params, None)
        if err != 0:
            raise RuntimeError(f"gputransforms: the joint step's CUDA kernel did not launch (CUresult {err})")

    return call


def layout(rows: np.ndarray, shapes: list) -> tuple:
    """(meta int64 (N, _META) without the source pointers, colour float32 (N, _COLOUR), output sizes (h, w)
    per image): what the kernels read, from the batch's rows of parameters (the colour block, then the
    window's stage) and its decoded images' (H, W)."""
    n = rows.shape[0]
    meta = np.zeros((n, _META), dtype=np.int64)
    stage = rows[:, COLOUR_WIDTH:COLOUR_WIDTH + STAGE_WIDTH].astype(np.int64)
    meta[:, 1:3] = np.asarray(shapes, dtype=np.int64).reshape(n, 2)
    meta[:, 4:6] = stage[:, 2:4]
    planes = 3 * stage[:, 2] * stage[:, 3]
    meta[1:, 3] = np.cumsum(planes)[:-1]
    meta[:, 6:8] = stage[:, 0:2]
    meta[:, 8:10] = stage[:, 4:6] != 0
    cf = np.zeros((n, _COLOUR), dtype=np.float32)
    cf[:, :COLOUR_WIDTH] = rows[:, :COLOUR_WIDTH]
    return meta, cf, [(int(h), int(w)) for h, w in stage[:, 2:4]]


def run(images: list, rows: np.ndarray, program, affine: Optional[tuple]) -> list:
    """The joint step's pixels for a batch: ``images`` the graph's decoded images (HWC uint8 CUDA tensors),
    ``rows`` their rows of parameters (``JointProgram.row``), ``affine`` the hand-off's (scale, shift) per
    channel for float32 output, or None for uint8. Each output a CHW tensor of its own (one allocation per image,
    as the hand-off's own map makes them: one buffer for the batch, of another size each batch, left torch's
    caching allocator with more device memory reserved: hflip 1.3 -> 2.4 GB on an H200)."""
    means, pixels = _kernels()
    dev = images[0].device
    meta, cf, sizes = layout(rows, [tuple(t.shape[:2]) for t in images])
    meta[:, 0] = [t.data_ptr() for t in images]
    dtype = torch.float32 if affine is not None else torch.uint8
    outs = [torch.empty((3, h, w), dtype=dtype, device=dev) for h, w in sizes]
    meta[:, 3] = [t.data_ptr() for t in outs]
    n = len(images)
    # one copy to the device: the int64 table, then the colour floats' bits
    host = torch.empty(n * (_META + _COLOUR // 2), dtype=torch.int64, pin_memory=True)
    h = host.numpy()
    h[:n * _META] = meta.ravel()
    h[n * _META:] = cf.view(np.int64).ravel()
    table = host.to(dev, non_blocking=True)
    meta_d, colour_d = table[:n * _META], table[n * _META:].view(torch.float32)
    sums = torch.zeros(2 * n, dtype=torch.int64, device=dev)
    largest = int(max((meta[:, 1] * meta[:, 2]).max(), 1))
    for k, col in ((1, 1), (2, 5)):  # the early contrast's mean, then the late one's (it may need the first)
        if (cf[:, col] != 1.0).any():
            blocks = min(max(1, -(-largest // (_THREADS * 8))), 256)
            means((blocks, n, 1), (_THREADS, 1, 1), [meta_d, colour_d, sums, n, k])
    fill = [float(v) for v in program.fill]
    scale, shift = affine if affine is not None else ((1.0,) * 3, (0.0,) * 3)
    plane = max(h * w for h, w in sizes)
    blocks = min(max(1, -(-plane // (_THREADS * 4))), 512)
    pixels((blocks, n, 1), (_THREADS, 1, 1), [meta_d, colour_d, sums, n, int(affine is not None),
                                              *fill, *(float(v) for v in scale), *(float(v) for v in shift)])
    return outs
