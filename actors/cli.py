"""The ``aisrl`` command line: ``report`` and ``demo-dump`` (the Ray commands join as they land)."""

from pathlib import Path

import typer
from rich.console import Console

from system.report.demo_dump import make_demo_dump
from system.report.dump import DumpError, save_dump

app = typer.Typer(add_completion=False, no_args_is_help=True, help="aisrl: asynchronous RL with measured train-inference mismatch.")
console = Console(stderr=True)


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code=2)


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
