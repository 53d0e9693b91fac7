"""Where the manifests, the Dockerfile and the KubeRay CRDs are, and how they are read (strictly)."""

import functools
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = Path(os.environ.get("AISRL_KUBERAY_CRDS") or ROOT.parent / "shared" / "kuberay-crds")
HAVE_CRDS = CRD_DIR.is_dir()
needs_crds = pytest.mark.skipif(
    not HAVE_CRDS,
    reason=f"KubeRay CRD schema check: runs where {CRD_DIR} exists (../shared/kuberay-crds beside "
           "the checkout, as in CI; or set AISRL_KUBERAY_CRDS)")
KUBERAY = ROOT / "deploy" / "kuberay"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
ENTRYPOINT = "aisrl train configs/gpu_qwen25_1p5b_gsm8k.yaml configs/multinode.yaml"
RAY_KINDS = ("RayCluster", "RayJob")


# -- loading -------------------------------------------------------------------------------------

class StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a manifest with one is an error."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        dupes = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        if dupes:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key(s) {dupes}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.load_all(path.read_text(), Loader=StrictLoader) if d is not None]


@functools.cache
def crd_schemas() -> dict[str, dict]:
    """``{kind: openAPIV3Schema}`` of the served ``ray.io/v1`` version of each CRD."""
    if not HAVE_CRDS:
        raise FileNotFoundError(f"no KubeRay CRDs at {CRD_DIR} (set AISRL_KUBERAY_CRDS)")
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1" and v["served"]]
        out[crd["spec"]["names"]["kind"]] = v1["schema"]["openAPIV3Schema"]
    return out


def shipped_files() -> dict[str, list[dict]]:
    """``{file name: its documents}`` of ``deploy/kuberay/``."""
    return {p.name: load_docs(p) for p in sorted(KUBERAY.glob("*.yaml"))}


def shipped() -> list[tuple[str, dict]]:
    return [(f"{name}#{i}", d) for name, docs in shipped_files().items() for i, d in enumerate(docs)]


def shipped_kind(kind: str) -> dict:
    [doc] = [d for _, d in shipped() if d.get("kind") == kind]
    return doc
