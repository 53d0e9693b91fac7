"""``metrics.jsonl``, one record per learner step, as a resume reads and trims it.

A run appends one JSON record per step (``system.report.sinks.JsonlSink``); a kill or a full disk can
cut the last line. A resume drops the records past the checkpoint it starts from and a cut last line
(:func:`trim_metrics`), and refuses, before anything starts, a file with a line that is not a record
before other records (:func:`last_step`, :func:`trim_metrics`): that is an edited or damaged file, and dropping the line
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


def last_step(run_dir: str | Path) -> int:
    """The step of the last record in ``metrics.jsonl`` (0 without one): before a resume trims the file,
    the last step its abandoned attempt finished, and sent to W&B (the record goes to W&B, then here).
    Refuses, before anything starts, a file :func:`trim_metrics` would refuse: a line that is not a
    record before the last record."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    lines, torn = _metrics_lines(path)
    return max((s for _, s in lines[:len(lines) - torn]), default=0)


def trim_metrics(run_dir: str | Path, step: int) -> int:
    """Drop the ``metrics.jsonl`` records past ``step`` (the checkpoint a resume starts from) and the
    lines at its end that are not records (cut by a kill or a full disk); returns how many lines were
    dropped. A line that is not a record before another record is refused (as by :func:`last_step`),
    never dropped: it is not one a stop cuts."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    lines, torn = _metrics_lines(path)
    kept = [line for line, s in lines[:len(lines) - torn] if s <= step]
    dropped = len(lines) - len(kept)
    if dropped:
        write_text_whole(path, "".join(f"{line}\n" for line in kept))
    return dropped
