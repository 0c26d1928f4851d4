"""Every dotted ``torch.*`` and ``pynvml.*`` name the package's source spells resolves against
the libraries installed here. ``torch.cuda.memoryreserved_bytes`` (no such function) sat
behind ``torch.cuda.is_available()`` and would have blanked every GPU memory metric on a
GPU's first tick: no CPU test ran that line. This one reads every line, run or not."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tuner"
ROOTS = ("torch", "pynvml")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in ROOTS:
        return ".".join([node.id, *reversed(parts)])
    return None


def names_in_source() -> dict[str, list[str]]:
    """Each longest dotted name under :data:`ROOTS`, with where it is written."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                name = _dotted(node)
                if name and "." in name:
                    found.setdefault(name, []).append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def resolve(name: str) -> object:
    """The object ``name`` names: attributes from its root, importing submodules on the way
    (``torch.distributed.fsdp`` is a module until imported)."""
    parts = name.split(".")
    obj: object = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if not hasattr(obj, part):
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
                continue
            except ImportError:
                raise AttributeError(f"{'.'.join(parts[:i])} has no {part!r}") from None
        obj = getattr(obj, part)
    return obj


NAMES = names_in_source()


def test_the_source_names_the_gpu_apis_it_relies_on():
    """The scan finds the CUDA and NVML lines (a scan that found nothing would pass anything)."""
    for expected in ("torch.cuda.memory_reserved", "torch.cuda.max_memory_reserved", "torch.cuda.Event",
                     "pynvml.nvmlDeviceGetComputeRunningProcesses", "pynvml.nvmlDeviceGetTotalEnergyConsumption",
                     "torch.cuda.mem_get_info", "torch.cuda.nccl.version"):
        assert expected in NAMES, expected
    assert len(NAMES) > 100  # 108 when written


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_dotted_torch_and_nvml_name_exists(name):
    try:
        resolve(name)
    except AttributeError as exc:
        pytest.fail(f"{name} ({', '.join(NAMES[name][:3])}): {exc}")


def test_the_scan_catches_the_typo_that_would_have_blanked_the_gpu_metrics():
    with pytest.raises(AttributeError, match="memoryreserved_bytes"):
        resolve("torch.cuda.memoryreserved_bytes")
