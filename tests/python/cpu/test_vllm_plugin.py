"""vLLM's general plugin: declared as an entry point of the group vLLM loads, and register() turns the
symm_mem override on (once) without importing vLLM."""

import importlib.metadata
import sys
from pathlib import Path

import pytest
import torch

from tpfuse import symm_mem, vllm_plugin

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
GROUP = "vllm.general_plugins"


def test_the_entry_point_is_declared_in_the_group_vllm_loads():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["entry-points"][GROUP] == {"tpfuse": "tpfuse.vllm_plugin:register"}


def test_an_installed_tpfuse_offers_the_entry_point():
    try:
        distribution = importlib.metadata.distribution("tpfuse")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tpfuse is not installed here (CI installs its wheel); the declaration is tested above")
    [entry_point] = [entry for entry in distribution.entry_points if entry.group == GROUP]
    assert entry_point.name == "tpfuse" and entry_point.load() is vllm_plugin.register


def cuda_kernel_of(op_name: str) -> str:
    return next((line for line in torch._C._dispatch_dump(f"symm_mem::{op_name}").splitlines()
                 if line.startswith("CUDA: ")), "")


def test_register_turns_the_override_on_once(monkeypatch):
    import torch.distributed._symmetric_memory  # noqa: F401 -- defines the symm_mem ops
    monkeypatch.setattr(vllm_plugin, "_override", None)
    torchs = {name: cuda_kernel_of(name) for name in symm_mem.OPS}
    vllm_plugin.register()
    override = vllm_plugin._override
    try:
        assert override is not None and override.active
        assert symm_mem.SymmMemOverride._active["CUDA"][1] == 1
        assert all(cuda_kernel_of(name) != torchs[name] for name in symm_mem.OPS)
        vllm_plugin.register()  # vLLM may call it again in a process: nothing changes
        assert vllm_plugin._override is override and symm_mem.SymmMemOverride._active["CUDA"][1] == 1
    finally:
        override.restore()
    assert {name: cuda_kernel_of(name) for name in symm_mem.OPS} == torchs
    assert "vllm" not in sys.modules
