"""The core stays Ray-free: every ``system`` module is imported in a fresh interpreter.

- nothing under ``system`` imports ``ray`` or ``actors``;
- ``system.config`` imports no torch;
- only ``system.rollout.vllm_engine`` has an ``import vllm``; only ``system.report.wandb_sink``
  has an ``import wandb`` (modules that use them go through those two).

Importing only adds to ``sys.modules``, so ONE interpreter that imports every ``system`` module
(and one that imports every ``system.config`` module) shows whether ANY of them pulls in a
library; only when one does are the modules probed one by one, to name the culprit.
"""

import ast
import functools
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "system").rglob("*.py")
)
CONFIG_MODULES = [m for m in MODULES if m.startswith("system.config")]
ALLOWED = {"vllm": {"system.rollout.vllm_engine"}, "wandb": {"system.report.wandb_sink"}}

_PROBE = (
    "import importlib, json, sys\n"
    "for name in sys.argv[1:]: importlib.import_module(name)\n"
    "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
)


def loaded_by(modules: list[str]) -> set[str]:
    """Top-level packages in ``sys.modules`` after a fresh interpreter imports ``modules``."""
    return set(_loaded_by(tuple(modules)))


@functools.cache  # every system module at once: two tests read it
def _loaded_by(modules: tuple[str, ...]) -> frozenset[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE, *modules], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return frozenset(json.loads(out.stdout.strip().splitlines()[-1]))


def culprits(modules: list[str], libs: set[str]) -> list[str]:
    """The modules that pull in any of ``libs``, each probed alone (two interpreters at a time)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        loaded = dict(zip(modules, pool.map(lambda m: loaded_by([m]), modules), strict=True))
    return [f"{m} pulls in {sorted(libs & got)}" for m, got in loaded.items() if libs & got]


def test_module_list_is_not_empty():
    assert "system.config" in MODULES and len(MODULES) > 5 and CONFIG_MODULES


def test_the_probe_sees_a_transitive_import():
    # actors.control imports ray; the probe must report it (else the checks below could not fail).
    assert {"ray", "actors"} <= loaded_by(["actors.control"])


def test_no_system_module_pulls_in_ray_or_actors():
    bad = {"ray", "actors"} & loaded_by(MODULES)
    assert not bad, culprits(MODULES, bad)


def test_no_config_module_pulls_in_torch():
    bad = {"torch"} & loaded_by(CONFIG_MODULES)
    assert not bad, culprits(CONFIG_MODULES, bad)


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


def test_the_driver_does_not_load_vllm():
    """The driver imports the rollout worker's actor class but never builds an engine: importing vLLM
    there cost ~4 s of a 2-core machine at every start, beside the ranks and workers starting
    (``system.rollout.worker`` imports the engine module when it builds one)."""
    assert "vllm" not in loaded_by(["actors.trainer", "actors.cli"])
    assert "vllm" in loaded_by(MODULES)  # the probe sees it where it is imported (system.rollout.vllm_engine)
