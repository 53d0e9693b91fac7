"""GSM8K-style prompt files: rows with ``question`` and ``answer`` ending in ``#### <number>``.

Rows come from ``.jsonl`` (one JSON object per line; blank lines are skipped) or ``.parquet``
(needs ``pyarrow``). The prompt is ``prompt_template.format(question=...)`` and the reference
is the canonical number after the answer's last ``####`` (``"1,000.0"`` -> ``"1000"``), which must
be all that follows it (a ``$`` before and a ``.`` after are allowed; ``3/4`` or ``12 apples`` are
refused, never read as 3 or 12).

A bad row is an error, not a silent skip: :class:`ValueError` names the file and the line
(jsonl, 1-based) or row (parquet, 0-based) and what is wrong, so a corrupt dataset never
trains on fewer prompts than the user thinks. A question given more than once is kept as often as it
is given and counted in a warning at load, which names the first one given with two different
answers (one copy is then rewarded against a wrong label; refusing it could refuse a public dataset
the user cannot edit).
"""

import json
import logging
from collections.abc import Iterator
from pathlib import Path

from system.rewards.numbers import MARKER, NUMBER, normalise_number
from system.types import Prompt

log = logging.getLogger(__name__)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are unique (``json`` keeps the last of two silently: a row's first
    ``answer`` would vanish without a word)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def _jsonl_rows(path: Path) -> Iterator[tuple[str, object]]:
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:  # a UTF-8 byte-order mark at the start of the file is allowed
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: line {line_no}: not UTF-8 (byte {raw[e.start]:#04x} at column "
                                 f"{e.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line, object_pairs_hook=_unique_keys)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_no}: not valid JSON ({e.msg})") from None
            except (ValueError, RecursionError) as e:  # a key twice; JSON beyond the parser: 5000-digit ints, deep nesting
                what = str(e) if "appears twice" in str(e) else f"JSON beyond the parser's limits ({type(e).__name__}: {str(e)[:80]})"
                raise ValueError(f"{path}: line {line_no}: {what}") from None
            yield f"line {line_no}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, object]]:
    try:
        import pyarrow.parquet as pq  # optional dependency, only for .parquet files
    except ImportError:
        raise ValueError(f"{path}: reading .parquet needs pyarrow (pip install pyarrow)") from None
    for row_no, row in enumerate(pq.read_table(path).to_pylist()):
        yield f"row {row_no}", row


def _prompt_of(row: object, where: str, path: Path, template: str) -> Prompt:
    if not isinstance(row, dict):
        raise ValueError(f"{path}: {where}: expected an object, got {type(row).__name__}")
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise ValueError(f"{path}: {where}: missing or empty string field {key!r}")
        try:  # JSON's \ud83d escapes can make a lone surrogate, which no tokenizer or checkpoint can encode
            row[key].encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{path}: {where}: field {key!r} holds {row[key][e.start]!r} at character "
                             f"{e.start + 1}, which is not text (a lone UTF-16 surrogate)") from None
    _, marker, tail = row["answer"].rpartition(MARKER)
    final = tail.strip().removeprefix("$").removesuffix(".")
    reference = normalise_number(final) if marker and NUMBER.fullmatch(final) else None
    if reference is None:  # a label read loosely ("#### 3/4" as 3) would train against a wrong answer
        shown = f"{tail.strip()[:60]!r}" if marker else "none"
        raise ValueError(f"{path}: {where}: answer must end in '#### <number>' (a number such as 72, -3.5 or "
                         f"$1,234); after its last '####': {shown}")
    prompt_id = f"{path.stem}-{where.replace(' ', '')}"
    return Prompt(prompt_id=prompt_id, text=template.format(question=row["question"].strip()),
                  reference=reference)


def load_gsm8k(path: str | Path, prompt_template: str = "Question: {question}\nAnswer:") -> list[Prompt]:
    """Every row of ``path`` as a prompt; raises :class:`ValueError` on the first bad row."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data.task.path: {path} is not a file")
    if path.suffix == ".jsonl":
        rows = _jsonl_rows(path)
    elif path.suffix == ".parquet":
        rows = _parquet_rows(path)
    else:
        raise ValueError(f"data.task.path: {path} must end in .jsonl or .parquet")
    prompts, first_seen, repeats, conflicts = [], {}, 0, []
    for where, row in rows:
        prompt = _prompt_of(row, where, path, prompt_template)
        seen = first_seen.setdefault(prompt.text, (where, prompt.reference))
        if seen[0] != where:
            repeats += 1
            if seen[1] != prompt.reference:
                conflicts.append(f"{where} gives {prompt.reference}, {seen[0]} {seen[1]}")
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no rows")
    if repeats:
        log.warning("%s: %d rows repeat an earlier row's question, each kept; %d with another answer%s", path,
                    repeats, len(conflicts), f" (one of the labels is wrong: {conflicts[0]})" if conflicts else "")
    return prompts
