"""``metrics.jsonl``, one record per learner step, as a resume reads and trims it.

A run appends one JSON record per step (``system.report.sinks.JsonlSink``); a kill or a full disk can
cut the last line. A resume drops the records past the checkpoint it starts from and a cut last line
(:func:`trim_metrics`), and refuses, before anything starts, a file with a line that is not a record
before other records (:func:`wandb_sent_through`, :func:`trim_metrics`): that is an edited or damaged file, and dropping the line
would lose a step's record for good.
"""

import json
from pathlib import Path

from system.run_state import write_text_whole

METRICS_FILE = "metrics.jsonl"


def _record_step(line: str) -> int | None:
    """The step of one ``metrics.jsonl`` line, None if it is not a record (not JSON, not an object, no
    whole-number ``step``)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _metrics_lines(path: Path) -> tuple[list[tuple[str, int | None]], int]:
    """Each line of ``metrics.jsonl`` with its step, and how many lines at the end are not records: a
    line cut by a kill or a full disk (the run stops there). A line that is not a record with records
    after it was not cut so (the file was edited or damaged): refused with its line numbers."""
    lines = [(line, _record_step(line)) for line in path.read_text(errors="replace").splitlines()]
    torn = 0
    while torn < len(lines) and lines[len(lines) - 1 - torn][1] is None:
        torn += 1
    damaged = [i + 1 for i, (_, step) in enumerate(lines[:len(lines) - torn]) if step is None]
    if damaged:
        one = len(damaged) == 1
        numbers = ", ".join(map(str, damaged[:10])) + (" ..." if len(damaged) > 10 else "")
        raise ValueError(
            f"{path}: line{'' if one else 's'} {numbers} {'is' if one else 'are'} not a step record (JSON with a "
            f"whole-number \"step\"), with records after {'it' if one else 'them'}: not a line cut by a stop but an "
            f"edited or damaged file; repair or delete {'that line' if one else 'those lines'}, then resume")
    return lines, torn


WANDB_SENT_FILE = "wandb_sent.json"
"""``{"step": N}``: the last step the run's W&B run holds, saved when a resume trims ``metrics.jsonl``
(the records that said so are dropped then; a second resume still needs it)."""


def wandb_sent_through(run_dir: str | Path) -> int:
    """The last step the run's W&B run holds (0: none): the larger of the step a resume saved
    (:data:`WANDB_SENT_FILE`) and the last ``metrics.jsonl`` record that W&B took
    (``report/wandb_live`` 1; the record goes to W&B, then here). Refuses, before anything starts, a
    file :func:`trim_metrics` would refuse: a line that is not a record before the last record."""
    run_dir = Path(run_dir)
    sent = 0
    path = run_dir / METRICS_FILE
    if path.is_file():
        lines, torn = _metrics_lines(path)
        sent = max((s for line, s in lines[:len(lines) - torn] if json.loads(line).get("report/wandb_live") == 1),
                   default=0)
    try:
        saved = json.loads((run_dir / WANDB_SENT_FILE).read_text())["step"]
    except (OSError, ValueError, TypeError, KeyError):  # none yet (or damaged: metrics.jsonl's word alone)
        saved = 0
    return max(sent, saved if isinstance(saved, int) and not isinstance(saved, bool) else 0)


def _save_wandb_sent(run_dir: str | Path, step: int) -> None:
    """Keep :func:`wandb_sent_through` across the trim of a resume (:data:`WANDB_SENT_FILE`)."""
    write_text_whole(Path(run_dir) / WANDB_SENT_FILE, json.dumps({"step": step}))


def trim_metrics(run_dir: str | Path, step: int, wandb_sent: int = 0) -> int:
    """Drop the ``metrics.jsonl`` records past ``step`` (the checkpoint a resume starts from) and the
    lines at its end that are not records (cut by a kill or a full disk); returns how many lines were
    dropped. A line that is not a record before another record is refused (as by :func:`wandb_sent_through`),
    never dropped: it is not one a stop cuts. ``wandb_sent`` (:func:`wandb_sent_through`, read before),
    when past ``step``, is kept in :data:`WANDB_SENT_FILE`: the records that said so go now."""
    if wandb_sent > step:
        _save_wandb_sent(run_dir, wandb_sent)
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    lines, torn = _metrics_lines(path)
    kept = [line for line, s in lines[:len(lines) - torn] if s <= step]
    dropped = len(lines) - len(kept)
    if dropped:
        write_text_whole(path, "".join(f"{line}\n" for line in kept))
    return dropped
