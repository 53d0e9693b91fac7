"""Strict pydantic configs (one module per section), composition and the resolved dump. No torch here."""

from system.config.loading import ConfigError, dump_config, resolve_config
from system.config.paths import check_output_dir
from system.config.run import RunConfig

__all__ = ["ConfigError", "RunConfig", "check_output_dir", "dump_config", "resolve_config"]
