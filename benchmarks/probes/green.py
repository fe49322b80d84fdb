"""A CUDA stream on a green context: kernels launched on it run on ``num_sms`` of the GPU's SMs only
(CUDA 12.4+ driver API, through ctypes: torch 2.11 has no green-context streams, 2.14's need the
cuda.bindings package). The training benchmark's ``@smN`` runs the loop on such a stream, so that
the model cannot take the SMs left over, while DALI, in the primary context, may use all of them:
a probe of whether the loader's kernels beside the model wait for SMs."""
from __future__ import annotations

import ctypes

import torch

_CU_DEV_RESOURCE_TYPE_SM = 1
_CU_GREEN_CTX_DEFAULT_STREAM = 0x1
_CU_STREAM_NON_BLOCKING = 0x1


class _SmResource(ctypes.Structure):
    _fields_ = [("smCount", ctypes.c_uint), ("minSmPartitionSize", ctypes.c_uint),
                ("smCoscheduledAlignment", ctypes.c_uint)]


class _DevResource(ctypes.Structure):  # CUdevResource_v1: type, 92 bytes internal, a 48-byte union
    _fields_ = [("type", ctypes.c_int), ("_internal", ctypes.c_ubyte * 92), ("union", ctypes.c_ubyte * 48)]

    @property
    def sm(self) -> _SmResource:
        return _SmResource.from_buffer(self.union)


_KEEP: list = []  # green contexts live as long as the process: their streams are handed to torch


def _check(lib, res: int, what: str) -> None:
    if res != 0:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(res, ctypes.byref(msg))
        raise RuntimeError(f"{what}: CUDA error {res} ({(msg.value or b'?').decode()})")


def sm_count(device_index: int = 0) -> int:
    """The device's SMs, as the driver's resource API counts them."""
    torch.cuda.init()
    lib = ctypes.CDLL("libcuda.so.1")
    dev, res = ctypes.c_int(), _DevResource()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
    _check(lib, lib.cuDeviceGetDevResource(dev, ctypes.byref(res), _CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource")
    return res.sm.smCount


def green_stream(num_sms: int, device_index: int = 0) -> torch.cuda.ExternalStream:
    """A non-blocking stream whose kernels run on a group of at least ``num_sms`` SMs (rounded up to
    the device's partition granularity); the memory is the primary context's, as torch's."""
    torch.cuda.init()
    torch.cuda.synchronize(device_index)  # the primary context current on this thread
    lib = ctypes.CDLL("libcuda.so.1")
    dev, whole = ctypes.c_int(), _DevResource()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
    _check(lib, lib.cuDeviceGetDevResource(dev, ctypes.byref(whole), _CU_DEV_RESOURCE_TYPE_SM),
           "cuDeviceGetDevResource")
    if not 0 < num_sms <= whole.sm.smCount:
        raise ValueError(f"{num_sms} SMs: the device has {whole.sm.smCount}")
    group, rest, groups = _DevResource(), _DevResource(), ctypes.c_uint(1)
    _check(lib, lib.cuDevSmResourceSplitByCount(ctypes.byref(group), ctypes.byref(groups), ctypes.byref(whole),
                                                ctypes.byref(rest), 0, num_sms), "cuDevSmResourceSplitByCount")
    desc, green, stream = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    _check(lib, lib.cuDevResourceGenerateDesc(ctypes.byref(desc), ctypes.byref(group), 1), "cuDevResourceGenerateDesc")
    _check(lib, lib.cuGreenCtxCreate(ctypes.byref(green), desc, dev, _CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate")
    _check(lib, lib.cuGreenCtxStreamCreate(ctypes.byref(stream), green, _CU_STREAM_NON_BLOCKING, 0),
           "cuGreenCtxStreamCreate")
    _KEEP.append((lib, green, stream))
    s = torch.cuda.ExternalStream(stream.value, device=torch.device("cuda", device_index))
    s.sm_count = group.sm.smCount
    return s
