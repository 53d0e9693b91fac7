"""Environment variables a user of W&B expects a run to honour, applied to its config at start.

``WANDB_MODE`` wins over ``report.wandb.mode`` from a preset or the default (a preset's ``online``
included): scripts built on other trainers never pass W&B a mode, so the variable is how users
switch W&B off or offline (an air-gapped cluster, a quick test), and a run that went online against
it, or wrote an offline record under ``disabled``, did what they had turned off. A
``report.wandb.mode=...`` override on the command line, the most specific setting, wins over the
variable. W&B's legacy spellings ``dryrun`` (offline) and ``run`` (online) are accepted; anything
else is refused, naming the variable.
"""

from collections.abc import Mapping

from system.config.loading import ConfigError
from system.config.run import RunConfig

_WANDB_MODES = {"online": "online", "offline": "offline", "disabled": "disabled", "dryrun": "offline", "run": "online"}


def wandb_mode_from(env: Mapping[str, str], overrides: list[str] = ()) -> str | None:
    """The W&B mode ``WANDB_MODE`` asks for (None: unset, empty, or ``report.wandb.mode`` in ``overrides``,
    which wins); ConfigError naming the variable for a value W&B does not know."""
    raw = env.get("WANDB_MODE")
    if raw is None or raw == "" or any(o.split("=", 1)[0].strip() == "report.wandb.mode" for o in overrides):
        return None
    mode = _WANDB_MODES.get(raw.strip().lower())
    if mode is None:
        raise ConfigError(f"WANDB_MODE={raw!r} in the environment is not one of online, offline, disabled")
    return mode


def apply_environment(cfg: RunConfig, env: Mapping[str, str], overrides: list[str] = ()) -> tuple[RunConfig, list[str]]:
    """``cfg`` with ``WANDB_MODE`` applied unless ``overrides`` (the command line's ``key=value``) set
    ``report.wandb.mode``, and one note per setting it changed."""
    mode = wandb_mode_from(env, overrides)
    raw = env.get("WANDB_MODE")
    if mode is None or mode == cfg.report.wandb.mode:
        return cfg, []
    note = f"WANDB_MODE={raw} in the environment: W&B runs {mode} (report.wandb.mode was {cfg.report.wandb.mode})"
    wandb = cfg.report.wandb.model_copy(update={"mode": mode})
    return cfg.model_copy(update={"report": cfg.report.model_copy(update={"wandb": wandb})}), [note]
