"""The GPU-memory probe behind /metrics never fails a scrape."""

from __future__ import annotations

import sys
import types

import pytest

from proxy import app_state
from proxy.app_state import gpu_memory


@pytest.fixture(autouse=True)
def _no_host_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this host's driver says is no part of a test: no NVML unless a test gives
    its own (on a GPU host, pynvml or vLLM's copy answered with the host's GPUs)."""
    monkeypatch.setattr(app_state, "_NVML", [])
    monkeypatch.setitem(sys.modules, "pynvml", None)  # (an import of it fails)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


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


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, count: int = 4) -> None:
    class Memory:
        def __init__(self, used: int) -> None:
            self.used = used

    class NVMLError(Exception):
        pass

    uuids = {f"GPU-{chr(ord('a') + i)}": i for i in range(count)}

    def by_index(i: int) -> int:
        if not 0 <= i < count:
            raise NVMLError("invalid argument")
        return i

    def by_uuid(u: str) -> int:
        if u not in uuids:
            raise NVMLError("not found")
        return uuids[u]

    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = by_index  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: Memory(100 + h)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def test_nvml_reports_the_gpus_this_process_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML numbers every GPU of the machine, CUDA only those CUDA_VISIBLE_DEVICES
    names, in its order: with `CUDA_VISIBLE_DEVICES=2` (a GPU of a shared machine) the
    metric reported the other tenants' GPUs beside it, labelled 0..3 where the engine's
    GPU 0 is the machine's 2. Indices and UUIDs are read as CUDA reads them (up to the
    first it cannot), labelled by their place."""
    _fake_nvml(monkeypatch)
    assert gpu_memory() == {"0": 100, "1": 101, "2": 102, "3": 103}
    for visible, expected in (("2", {"0": 102}), ("3,GPU-b", {"0": 103, "1": 101}),
                              ("1,nope,3", {"0": 101}), ("1,7,3", {"0": 101}),
                              ("GPU-z", {}), ("", {}), ("-1", {}),
                              (" 2 , 0", {"0": 102, "1": 100})):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert gpu_memory() == expected, visible


def test_nvml_first_where_torch_has_a_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose torch has a CUDA context on one GPU (an embedder on cuda:0)
    made one on every other GPU too, with `mem_get_info(i)` for each: NVML, where there
    is one, is asked first."""
    class Cuda:
        is_available = staticmethod(lambda: True)
        is_initialized = staticmethod(lambda: True)
        device_count = staticmethod(lambda: 2)

        @staticmethod
        def mem_get_info(i: int) -> tuple[int, int]:
            raise AssertionError("a CUDA context made for a scrape")

    torch = types.ModuleType("torch")
    torch.cuda = Cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    _fake_nvml(monkeypatch, count=2)
    assert gpu_memory() == {"0": 100, "1": 101}
