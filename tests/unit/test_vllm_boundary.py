"""Only `proxy/engine/vllm.py` imports vLLM: the gateway runs (and its tests, CLI and
metrics work) where vLLM is not installed or not wanted, and one module owns what
vLLM's API is to Weir."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "proxy" / "engine" / "vllm.py"


def _imports_vllm(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            names = [node.args[0].value]
        if any(n == "vllm" or n.startswith("vllm.") for n in names):
            lines.append(node.lineno)
    return lines


def test_only_the_vllm_engine_module_imports_vllm() -> None:
    found = {}
    for folder in ("proxy", "plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == OWNER:
                continue
            if lines := _imports_vllm(ast.parse(path.read_text(), str(path))):
                found[str(path.relative_to(ROOT))] = lines
    assert not found


def test_the_check_sees_each_way_of_importing() -> None:
    for source in ("import vllm", "from vllm.x import y", "import vllm.third_party.pynvml",
                   "importlib.import_module('vllm.third_party.pynvml')",
                   "__import__('vllm')"):
        assert _imports_vllm(ast.parse(source)), source
    for source in ("import vllmx", "from .engine.vllm import bundled_nvml",
                   "importlib.import_module('pynvml')"):
        assert not _imports_vllm(ast.parse(source)), source
