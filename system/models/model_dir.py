"""Where the policy's weights come from: the cached tiny build, or a pretrained directory / hub id."""

from pathlib import Path

from system.config import RunConfig
from system.models.tiny import build_tiny_model, default_cache_dir


def resolve_model_dir(cfg: RunConfig, cache_dir: str | Path | None = None) -> str:
    """A path (or hub id) that transformers' ``from_pretrained`` and vLLM both load."""
    if cfg.model.type == "pretrained":
        local = Path(cfg.model.path).expanduser()
        return str(local) if local.exists() else cfg.model.path
    return str(build_tiny_model(cfg.model, cfg.data.task, cfg.seed, cache_dir or default_cache_dir()))
