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

    torch = types.ModuleType("torch")
    torch.cuda = Cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert gpu_memory() == {}


def test_reports_each_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    class Cuda:
        is_available = staticmethod(lambda: True)
        device_count = staticmethod(lambda: 2)
        mem_get_info = staticmethod(lambda i: (10 * (i + 1), 100))

    torch = types.ModuleType("torch")
    torch.cuda = Cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert gpu_memory() == {"0": 90, "1": 80}
