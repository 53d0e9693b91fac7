"""The ``aisrl`` command line: ``train``, ``report`` and ``demo-dump``."""

import json
from pathlib import Path

import typer
from rich.console import Console

from system.config import ConfigError, RunConfig, dump_config, resolve_config
from system.report.demo_dump import make_demo_dump
from system.report.dump import DumpError, save_dump

app = typer.Typer(add_completion=False, no_args_is_help=True, help="aisrl: asynchronous RL with measured train-inference mismatch.")
console = Console(stderr=True)


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code=2)


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """Presets (``*.yaml`` / ``*.yml`` / ``*.json`` files) and ``dotted.key=value`` overrides."""
    presets, overrides = [], []
    for arg in args:
        if "=" in arg:
            overrides.append(arg)
        elif arg.endswith((".yaml", ".yml", ".json")):
            presets.append(arg)
        else:
            raise ConfigError(f"argument {arg!r} is neither a preset file (.yaml) nor a dotted.key=value override")
    return presets, overrides


def load_run_config(args: list[str], resume: Path | None) -> RunConfig:
    presets, overrides = split_args(args)
    if resume is not None:
        saved = resume / "config.json"
        if not saved.is_file():
            raise ConfigError(f"--resume {resume}: no config.json there")
        presets = [str(saved), *presets]
        overrides = [*overrides, f"output_dir={resume}"]
    return resolve_config(presets, overrides)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    args: list[str] = typer.Argument(None, help="Presets (configs/*.yaml, applied left to right) and dotted.key=value overrides."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate, print the resolved config and the placement plan; start nothing."),
    resume: Path = typer.Option(None, "--resume", help="Continue the run in this directory from its last complete checkpoint."),
) -> None:
    """Train: rollout workers, FSDP2 learner and correction service on Ray (a private local cluster unless ray.address is set)."""
    try:
        cfg = load_run_config(args or [], resume)
    except ConfigError as exc:
        _fail(str(exc))
    if dry_run:
        from actors.placement import describe_plan, plan_placement

        print(dump_config(cfg))
        print(json.dumps({"placement": describe_plan(plan_placement(cfg, None))}, indent=2))
        return
    from actors.trainer import Trainer

    trainer = None
    try:
        trainer = Trainer(cfg, resume=resume is not None)
        last = trainer.run()
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    finally:
        if trainer is not None:
            trainer.shutdown()
    console.print(f"[green]done[/]: {cfg.max_steps} steps in {cfg.output_dir}; final reward/mean {last.get('reward/mean', float('nan')):.3f}; report {trainer.report_path}")


@app.command()
def report(
    dump: Path = typer.Argument(..., help="A batch dump (.npz, CORRECTION_SPEC.md section 6)."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for summary.json, samples.json, report.html."),
) -> None:
    """Write the mismatch report of one batch dump."""
    from system.report.mismatch_report import write_report

    try:
        summary = write_report(dump, out)
    except DumpError as exc:
        _fail(str(exc))
    console.print(
        f"[green]report written[/] to {out}/report.html: {summary['n_sequences']} sequences, "
        f"{summary['n_tokens']} tokens, kl_k1 {summary['kl_k1']:.3g}, "
        f"seq-mis keeps {summary['methods']['seq-mis']['keep_seq_frac']:.1%} of sequences"
    )


@app.command("demo-dump")
def demo_dump(
    path: Path = typer.Argument(..., help="Where to write the .npz."),
    sequences: int = typer.Option(64, min=1, help="Responses in the batch."),
    max_len: int = typer.Option(48, min=1, help="Padded response length."),
    sigma: float = typer.Option(0.05, min=0.0, help="Per-token log-ratio noise at lag 0 (grows with lag)."),
    seed: int = typer.Option(0, help="Random seed."),
) -> None:
    """Write a synthetic batch dump with a controlled mismatch (for trying the report)."""
    save_dump(path, **make_demo_dump(sequences, max_len, sigma=sigma, seed=seed))
    console.print(f"wrote {path}")
