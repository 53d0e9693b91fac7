"""The config of a resumed run: the run's own ``config.json``, then the user's presets and overrides,
refused where it would change what the checkpoint was made with (before anything starts)."""

from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from system.config.data import TaskConfig
from system.config.loading import ConfigError, combine_overrides, read_preset, resolve_config
from system.config.model import ModelConfig
from system.config.run import RunConfig


def resume_config(run_dir: Path, presets: list[str] = (), overrides: list[str] = ()) -> RunConfig:
    """``run_dir/config.json``, then ``presets`` and ``overrides``, with ``output_dir`` = ``run_dir`` as
    given (a path, never read as YAML: a run named ``2024-01-01`` or ``'q'`` is that name); raises
    ConfigError naming what is wrong (no config.json, another output_dir, a fixed field changed)."""
    saved = run_dir / "config.json"
    if not saved.is_file():
        raise ConfigError(f"--resume {run_dir}: no config.json there")
    check_saved_config(saved, f"--resume {run_dir}")
    given = combine_overrides(list(overrides)).get("output_dir")
    if given is not None and Path(str(given)).expanduser().resolve() != run_dir.expanduser().resolve():
        raise ConfigError(f"--resume {run_dir} continues the run in that directory; output_dir={given} "
                          "names another (to start a new run from a config, leave out --resume)")
    cfg = resolve_config([str(saved), *presets], overrides, fixed=("--resume", {"output_dir": str(run_dir)}))
    check_unchanged_on_resume(run_dir, cfg)
    return cfg


def check_saved_config(saved: Path, what: str) -> None:
    """ConfigError unless the run's ``config.json`` holds a mapping with keys: an empty one (a probe: a
    truncated file) read as no layer at all, so the run resumed with every default (150 steps, seed 0)."""
    if not read_preset(saved):
        raise ConfigError(f"{what}: {saved} is empty (a damaged run directory?): the run's config cannot be read "
                          "back; restore it, or start a new run")


def check_unchanged_on_resume(run_dir: Path, cfg: RunConfig) -> None:
    """ConfigError when ``cfg`` changes what the checkpoint of the run in ``run_dir`` was made with."""
    changed = changed_on_resume(saved_with_defaults(run_dir / "config.json"), cfg)
    if changed:
        raise ConfigError(f"--resume {run_dir}: {', '.join(changed)} cannot change on a resume (the checkpoint's "
                          "prompt stream and weights were made with the saved values); start a new run instead")


def saved_with_defaults(saved: Path) -> dict:
    """A run's config.json with today's schema defaults in the parts a resume compares (``seed``,
    ``model``, ``data.task``): a field added since the run was written takes its default, as it does
    in the resumed config (the user changed nothing). A part that no longer validates stays as
    written (the resumed config says what is wrong with it)."""
    data = read_preset(saved)

    def filled(value, schema):
        adapter = TypeAdapter(schema)
        try:
            return adapter.dump_python(adapter.validate_python(value), mode="json", by_alias=True)
        except ValidationError:
            return value

    defaults = RunConfig().model_dump(mode="json", by_alias=True)
    data.setdefault("seed", defaults["seed"])
    data.setdefault("model", defaults["model"])
    if isinstance(data.setdefault("data", {}), dict):
        data["data"].setdefault("task", defaults["data"]["task"])
    if isinstance(data.get("model"), dict):
        data["model"] = filled(data["model"], ModelConfig)
    if isinstance(data.get("data"), dict) and isinstance(data["data"].get("task"), dict):
        data["data"] = {**data["data"], "task": filled(data["data"]["task"], TaskConfig)}
    return data


ARCHITECTURE = ("type", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                "max_position_embeddings")
"""The model fields a checkpoint's weights fix (a pretrained model's path may move: a local snapshot)."""


def changed_on_resume(saved: dict, new: RunConfig) -> list[str]:
    """What a resume must keep, checked before anything starts (the checkpoint's sampler and weights
    were made with them): ``seed``, ``data.task`` but its path (a data file may move; the sampler's
    fingerprint checks its content), the model's architecture. ``saved``: the run's config with
    today's defaults (``saved_with_defaults``). The dotted names of those that differ."""
    now = new.model_dump(mode="json", by_alias=True)
    pairs = [("seed", saved.get("seed"), now["seed"])]
    old_task, new_task = dict(saved.get("data", {}).get("task", {})), dict(now["data"]["task"])
    old_task.pop("path", None), new_task.pop("path", None)
    pairs += [(f"data.task.{k}", old_task.get(k), new_task.get(k)) for k in sorted(set(old_task) | set(new_task))]
    old_model, new_model = saved.get("model", {}), now["model"]
    pairs += [(f"model.{k}", old_model.get(k), new_model.get(k)) for k in ARCHITECTURE if k in old_model or k in new_model]
    return [name for name, old, value in pairs if old != value]
