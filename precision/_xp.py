"""A tiny array namespace over numpy and torch (CPU or CUDA).

The exact kernels in :mod:`._wide`, :mod:`._exp` and :mod:`._matmul` are written once against this
namespace, so numpy and torch run the same integer algorithm. Bit identity across backends does not
rest on this, though: every kernel returns the exact mathematical result (float arithmetic is only
ever used as an estimate that is corrected or checked exactly), so any two correct backends agree.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np


#: device nodes of the drivers torch.cuda can use on Linux: NVIDIA's, ROCm's (torch.cuda on AMD) and WSL's GPU
CUDA_DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version", "/dev/kfd", "/dev/dxg")


#: the refusal of device "cuda" where :func:`cuda_available` is False (after "device: " or "--device: ")
NO_CUDA = "cuda: no CUDA device is available (use cpu)"


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, without importing torch (seconds) where the answer is surely
    no: on Linux without any of :data:`CUDA_DRIVER_NODES` no CUDA device can be used."""
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in CUDA_DRIVER_NODES):
        return False
    import torch

    return bool(torch.cuda.is_available())


def is_torch(x: Any) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


class NumpyXP:
    torch = False
    name = "numpy"
    device = None

    # conversions -------------------------------------------------------------------------------
    def f64(self, x):
        return np.asarray(x).astype(np.float64)

    def i64(self, x):
        return np.asarray(x).astype(np.int64)

    def asint(self, x):
        return np.ascontiguousarray(x, dtype=np.int64)

    def to_numpy(self, x):
        return np.asarray(x)

    def from_numpy(self, x):
        return np.asarray(x)

    def scalar_array(self, v, dtype=np.int64):
        return np.asarray(v, dtype=dtype)

    # elementwise ---------------------------------------------------------------------------------
    floor = staticmethod(np.floor)
    exp = staticmethod(np.exp)
    abs = staticmethod(np.abs)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)

    def where(self, c, a, b):
        return np.where(c, a, b)

    def clip(self, x, lo, hi):
        return np.clip(x, lo, hi)

    # reductions ----------------------------------------------------------------------------------
    def count(self, m) -> int:
        return int(np.count_nonzero(m))

    def any(self, m) -> bool:
        return bool(np.any(m))

    def minmax(self, x) -> tuple[int, int]:
        x = np.asarray(x)  # the wide-product path returns a Python int for 0-d operands
        if x.size == 0:
            return 0, 0
        return int(x.min()), int(x.max())

    def amax(self, x, axis, keepdims=False):
        return np.max(x, axis=axis, keepdims=keepdims)

    def sum(self, x, axis=None, keepdims=False):
        return np.sum(x, axis=axis, keepdims=keepdims)

    # shapes / misc ---------------------------------------------------------------------------------
    def zeros(self, shape, dtype=np.int64):
        return np.zeros(shape, dtype=dtype)

    def full(self, shape, value, dtype=np.int64):
        return np.full(shape, value, dtype=dtype)

    def empty(self, shape, dtype=np.int64):
        return np.empty(shape, dtype=dtype)

    def reshape(self, x, shape):
        return np.reshape(x, shape)

    def moveaxis(self, x, src, dst):
        return np.moveaxis(x, src, dst)

    def contiguous(self, x):
        return np.ascontiguousarray(x)

    def broadcast_to(self, x, shape):
        return np.broadcast_to(x, shape)

    def matmul(self, a, b):
        return np.matmul(a, b)

    def unique(self, x):
        return np.unique(x)

    def flatnonzero(self, m):
        return np.flatnonzero(m)

    def take_flat(self, x, idx):
        return np.ascontiguousarray(x).reshape(-1)[idx]

    def put_flat(self, x, idx, vals):
        """x must be a contiguous array owned by the caller; returns x."""
        x.reshape(-1)[idx] = np.asarray(vals, dtype=x.dtype)
        return x

    def indicator(self, m, dtype=np.float64):
        return m.astype(dtype)

    def float_dtype(self):
        return np.float64


class TorchXP:
    torch = True
    name = "torch"

    def __init__(self, device):
        import torch

        self.t = torch
        self.device = device

    def f64(self, x):
        if isinstance(x, (int, float)):
            return float(x)
        return x.to(self.t.float64)

    def i64(self, x):
        return x.to(self.t.int64)

    def asint(self, x):
        return x.to(self.t.int64).contiguous()

    def to_numpy(self, x):
        return x.detach().cpu().numpy()

    def from_numpy(self, x):
        x = np.asarray(x)
        if x.dtype == object:
            x = x.astype(np.int64)
        return self.t.as_tensor(np.ascontiguousarray(x), device=self.device)

    def scalar_array(self, v, dtype=None):
        return self.t.as_tensor(v, dtype=dtype or self.t.int64, device=self.device)

    def floor(self, x):
        return self.t.floor(x)

    def exp(self, x):
        return self.t.exp(x)

    def abs(self, x):
        return self.t.abs(x)

    def minimum(self, a, b):
        if not isinstance(b, self.t.Tensor):
            return self.t.clamp(a, max=b)
        if not isinstance(a, self.t.Tensor):
            return self.t.clamp(b, max=a)
        return self.t.minimum(a, b)

    def maximum(self, a, b):
        if not isinstance(b, self.t.Tensor):
            return self.t.clamp(a, min=b)
        if not isinstance(a, self.t.Tensor):
            return self.t.clamp(b, min=a)
        return self.t.maximum(a, b)

    def where(self, c, a, b):
        return self.t.where(c, a, b)

    def clip(self, x, lo, hi):
        return self.t.clamp(x, lo, hi)

    def count(self, m):
        """A 0-d int64 tensor (no host sync); callers convert once at the end of an operation."""
        return self.t.count_nonzero(m)

    def any(self, m) -> bool:
        return bool(m.any().item())

    def minmax(self, x) -> tuple[int, int]:
        if x.numel() == 0:
            return 0, 0
        mn, mx = self.t.aminmax(x)
        lo, hi = self.t.stack([mn, mx]).tolist()  # one host sync
        return int(lo), int(hi)

    def amax(self, x, axis, keepdims=False):
        return self.t.amax(x, dim=axis, keepdim=keepdims)

    def sum(self, x, axis=None, keepdims=False):
        if axis is None:
            return self.t.sum(x)
        return self.t.sum(x, dim=axis, keepdim=keepdims)

    def zeros(self, shape, dtype=None):
        return self.t.zeros(shape, dtype=dtype or self.t.int64, device=self.device)

    def full(self, shape, value, dtype=None):
        return self.t.full(shape, value, dtype=dtype or self.t.int64, device=self.device)

    def empty(self, shape, dtype=None):
        return self.t.empty(shape, dtype=dtype or self.t.int64, device=self.device)

    def reshape(self, x, shape):
        return x.reshape(shape)

    def moveaxis(self, x, src, dst):
        return self.t.movedim(x, src, dst)

    def contiguous(self, x):
        return x.contiguous()

    def broadcast_to(self, x, shape):
        return x.expand(shape)

    def matmul(self, a, b):
        return self.t.matmul(a, b)

    def unique(self, x):
        return self.t.unique(x)

    def flatnonzero(self, m):
        return self.t.nonzero(m.reshape(-1)).reshape(-1)

    def take_flat(self, x, idx):
        return x.contiguous().reshape(-1)[idx]

    def put_flat(self, x, idx, vals):
        x.view(-1)[idx] = self.t.as_tensor(np.asarray(vals, dtype=np.int64), device=self.device)
        return x

    def indicator(self, m, dtype=None):
        return m.to(dtype or self.t.float64)

    def float_dtype(self):
        return self.t.float64


NP = NumpyXP()
_torch_cache: dict[str, TorchXP] = {}


def torch_xp(device) -> TorchXP:
    key = str(device)
    if key not in _torch_cache:
        _torch_cache[key] = TorchXP(device)
    return _torch_cache[key]
