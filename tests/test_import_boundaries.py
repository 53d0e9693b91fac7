"""The core stays Ray-free: each ``system`` module is imported in a fresh interpreter.

- nothing under ``system`` imports ``ray`` or ``actors``;
- ``system.config`` imports no torch;
- only ``system.rollout.vllm_engine`` has an ``import vllm``; only ``system.report.wandb_sink``
  has an ``import wandb`` (modules that use them go through those two).
"""

import ast
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "system").rglob("*.py")
)
ALLOWED = {"vllm": {"system.rollout.vllm_engine"}, "wandb": {"system.report.wandb_sink"}}

_PROBE = (
    "import importlib, json, sys; importlib.import_module(sys.argv[1]); "
    "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
)


def _probe(module: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _PROBE, module], cwd=ROOT, capture_output=True, text=True, timeout=180
    )


@pytest.fixture(scope="module")
def probes() -> dict[str, subprocess.CompletedProcess]:
    """Every module's probe, two interpreters at a time (the imports are CPU-bound; 2 cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(MODULES, pool.map(_probe, MODULES), strict=True))


def _top_level_imports(out: subprocess.CompletedProcess) -> set[str]:
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_module_list_is_not_empty():
    assert "system.config" in MODULES and len(MODULES) > 5


@pytest.mark.parametrize("module", MODULES)
def test_boundaries(module, probes):
    loaded = _top_level_imports(probes[module])
    assert "ray" not in loaded, f"{module} pulls in ray"
    assert "actors" not in loaded, f"{module} pulls in actors"
    if module.startswith("system.config"):
        assert "torch" not in loaded, f"{module} pulls in torch"


def _direct_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_vllm_and_wandb_are_imported_in_one_module_each():
    offenders = []
    for path in sorted((ROOT / "system").rglob("*.py")) + sorted((ROOT / "actors").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for lib, owners in ALLOWED.items():
            if lib in _direct_imports(path) and module not in owners:
                offenders.append(f"{module} imports {lib}")
    assert offenders == []
