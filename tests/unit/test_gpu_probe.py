"""The GPU-memory probe behind /metrics never fails a scrape."""

from __future__ import annotations

import sys
import types

import pytest

from proxy.app_state import gpu_memory


def test_no_torch_or_torch_still_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # no `cuda` yet
    assert gpu_memory() == {}
    monkeypatch.delitem(sys.modules, "torch")
    assert gpu_memory() == {}


def test_broken_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    class Cuda:
        @staticmethod
        def is_available() -> bool:
            raise RuntimeError("driver error")

        is_initialized = is_available

    torch = types.ModuleType("torch")
    torch.cuda = Cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert gpu_memory() == {}


def test_reports_each_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    class Cuda:
        is_available = staticmethod(lambda: True)
        is_initialized = staticmethod(lambda: True)  # (this process's context, as below)
        device_count = staticmethod(lambda: 2)
        mem_get_info = staticmethod(lambda i: (10 * (i + 1), 100))

    torch = types.ModuleType("torch")
    torch.cuda = Cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert gpu_memory() == {"0": 90, "1": 80}


def test_no_cuda_context_is_made_for_a_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's `mem_get_info` opened a CUDA context on every GPU in the gateway's
    process at the first scrape (the engine runs in its own processes): hundreds of MiB
    of each GPU taken from the engine, and the event loop blocked meanwhile. Without a
    context of its own, the process asks NVML (the driver), and nothing where there is
    none."""
    from proxy import app_state

    class Cuda:
        is_available = staticmethod(lambda: True)
        is_initialized = staticmethod(lambda: False)
        device_count = staticmethod(lambda: 2)

        @staticmethod
        def mem_get_info(i: int) -> tuple[int, int]:
            raise AssertionError("a CUDA context made for a scrape")

    class Memory:
        def __init__(self, used: int) -> None:
            self.used = used

    inits = []
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: inits.append(1)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: Memory(7 * (h + 1))  # type: ignore[attr-defined]
    torch = types.ModuleType("torch")
    torch.cuda = Cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(app_state, "_NVML", [])
    assert gpu_memory() == {"0": 7, "1": 14}
    assert gpu_memory() == {"0": 7, "1": 14} and inits == [1]  # initialised once
    # no NVML (a CPU image, no driver): nothing, and no context either
    monkeypatch.setattr(app_state, "_NVML", [])
    monkeypatch.setitem(sys.modules, "pynvml", None)  # (an import of it fails)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert gpu_memory() == {}
