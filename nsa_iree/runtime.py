"""Running compiled artifacts on the tensors' device, through the IREE runtime.

One IREE device per torch device (CPU -> ``local-task``, CUDA -> ``cuda``, ROCm -> ``hip``).
``NSA_IREE_CPU_THREADS`` sets the number of CPU worker threads. Tensors go in zero-copy through DLPack
(a contiguous copy is made only for a non-contiguous, offset or unaligned view). The public outputs are
written by the kernels into torch tensors the caller allocated (``iree.abi.output`` arguments); other
results stay IREE buffers, handed straight to the next stage (``Device.export_tensor`` turns one into a
torch tensor without a copy). On CUDA, torch's stream is synchronised before each call and a call returns
once its results are ready (IREE's synchronous calling convention).

Transient buffers on CUDA: IREE's CUDA driver takes them from a stream-ordered memory pool that gives its
memory back at every synchronisation, and mapping gigabytes again costs about 8 ms per 64k-token backward
on the H200 (115.3-116.5 -> 107.5 ms; bench/results/experiments_H200.md). ``NSA_IREE_CACHING_ALLOCATOR=1``
(read when the first CUDA device is made) turns those asynchronous allocations off and wraps the device
allocator in IREE's caching allocator, which keeps freed buffers for the next call of the same sizes.
It is off by default because IREE 3.13 cannot give that memory back: trimming the cache fails
(``cuMemFree`` returns CUDA_ERROR_INVALID_VALUE under compute-sanitizer), so the kept buffers stay
reserved until the process exits, one set per distinct problem size. Use it for fixed-shape training runs
on a GPU with memory to spare.
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

import torch

_DLPACK_DEVICE = {"cpu": 1, "cuda": 2, "hip": 10}
_ALIGNMENT = 64


def importable(t: torch.Tensor) -> bool:
    """Whether IREE can take t's memory as it is: contiguous, at the start of its storage, 64-byte aligned."""
    return t.is_contiguous() and t.storage_offset() == 0 and t.data_ptr() % _ALIGNMENT == 0


def _driver_for(device: torch.device) -> str:
    if device.type == "cpu":
        return "local-task"
    if device.type == "cuda":
        return "hip" if getattr(torch.version, "hip", None) else "cuda"
    raise ValueError(f"nsa_iree runs on cpu and cuda/rocm tensors, got a tensor on {device}")


def caching_allocator() -> bool:
    """Whether CUDA devices keep freed IREE buffers for reuse (``NSA_IREE_CACHING_ALLOCATOR=1``; default off)."""
    return os.environ.get("NSA_IREE_CACHING_ALLOCATOR", "0") == "1"


class Device:
    """An IREE device standing for one torch device."""

    def __init__(self, torch_device: torch.device):
        import iree.runtime as rt

        self.torch_device = torch_device
        self.driver_name = _driver_for(torch_device)
        self.instance = rt.VmInstance()
        if torch_device.type == "cpu" and os.environ.get("NSA_IREE_CPU_THREADS"):
            # local-task worker count (set before the first CPU device is made; the flag is process-wide).
            rt.flags.parse_flags(f"--task_topology_group_count={int(os.environ['NSA_IREE_CPU_THREADS'])}")
        allocators = None
        if self.driver_name == "cuda" and caching_allocator():
            # Process-wide flag, read when the driver makes a device: IREE's queue allocations then come from
            # the device allocator, which the caching allocator wraps (see the module docstring).
            rt.flags.parse_flags("--cuda_async_allocations=false")
            allocators = ["caching"]
        driver = rt.get_driver(self.driver_name)
        if torch_device.type == "cpu":
            self.hal_device = driver.create_default_device()
        else:
            index = torch_device.index if torch_device.index is not None else torch.cuda.current_device()
            self.hal_device = driver.create_device(driver.query_available_devices()[index], allocators=allocators)
        self.hal_module = rt.create_hal_module(self.instance, self.hal_device)
        self._dlpack_type = _DLPACK_DEVICE["hip" if self.driver_name == "hip" else torch_device.type]
        self._modules: dict[Path, Module] = {}
        self._lock = threading.Lock()

    def module(self, vmfb: Path) -> "Module":
        with self._lock:
            if vmfb not in self._modules:
                self._modules[vmfb] = Module(self, vmfb)
            return self._modules[vmfb]

    def import_tensor(self, t: torch.Tensor):
        """A HalBufferView over t's memory (over a contiguous aligned copy when t is not importable)."""
        t = t.detach()
        if not importable(t):
            t = t.clone(memory_format=torch.contiguous_format)
        return self.hal_device.from_dlpack_capsule(t.__dlpack__())

    def copy_to_host(self, buffer_view) -> torch.Tensor:
        """A host copy of an IREE result (works for buffers IREE allocated itself, which CUDA cannot export)."""
        import iree.runtime as rt

        return torch.from_numpy(rt.DeviceArray(self.hal_device, buffer_view).to_host().copy())

    def export_tensor(self, buffer_view) -> torch.Tensor:
        """A torch tensor over the memory of an IREE result (no copy)."""
        index = self.torch_device.index or 0 if self.torch_device.type != "cpu" else 0
        capsule = self.hal_device.create_dlpack_capsule(buffer_view, self._dlpack_type, index)
        return torch.from_dlpack(capsule)


class Module:
    """A loaded vmfb: its functions are called with torch tensors, IREE buffers and Python scalars."""

    def __init__(self, device: Device, vmfb: Path):
        import iree.runtime as rt

        self.device = device
        self.vm_module = rt.VmModule.mmap(device.instance, str(vmfb))
        self.context = rt.VmContext(device.instance, modules=[device.hal_module, self.vm_module])
        self._functions = {}

    def call(self, name: str, *args, wait_for_torch: bool = True):
        """Invoke function `name`; tensors are imported, floats pushed as f32, ints as index/i64.

        wait_for_torch: on CUDA, let torch's pending work finish first (IREE runs on its own stream). A
        chain of stages needs it only before its first call: IREE's calls complete before they return.

        Returns the results as IREE buffer views (see Device.export_tensor).
        """
        import iree.runtime as rt

        fn = self._functions.get(name)
        if fn is None:
            fn = self.vm_module.lookup_function(name)
            if fn is None:
                raise KeyError(f"function {name!r} not in {self.vm_module.name}")
            self._functions[name] = fn
        inputs = rt.VmVariantList(len(args))
        for arg in args:
            if isinstance(arg, torch.Tensor):
                inputs.push_ref(self.device.import_tensor(arg))
            elif isinstance(arg, bool):
                raise TypeError("bool arguments are not supported")
            elif isinstance(arg, float):
                inputs.push_float(arg)
            elif isinstance(arg, int):
                inputs.push_int(arg)
            else:
                inputs.push_ref(arg)
        outputs = rt.VmVariantList(4)
        if wait_for_torch and self.device.torch_device.type == "cuda":
            torch.cuda.current_stream(self.device.torch_device).synchronize()
        self.context.invoke(fn, inputs, outputs)
        return [outputs.get_as_object(i, rt.HalBufferView) for i in range(outputs.size)]


@functools.lru_cache(maxsize=None)
def device_for(torch_device: torch.device) -> Device:
    return Device(torch_device)
