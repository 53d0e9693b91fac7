"""GSM8K-style files: references after the last ``####``, and bad rows named by file and line."""

import json
from pathlib import Path

import pytest

from system.config.data import JsonlTaskConfig
from system.data.gsm8k import load_gsm8k
from system.data.prompt_source import build_prompt_source

SAMPLE = Path(__file__).parent / "data" / "gsm8k_sample.jsonl"


def test_sample_file_references_and_prompts():
    prompts = load_gsm8k(SAMPLE, "Q: {question}\nA:")
    # written by hand from the file: commas dropped, "120.0" -> "120", sign and decimals kept
    assert [p.reference for p in prompts] == ["7", "60", "1550", "-6", "4.5", "120", "150", "999"]
    assert prompts[0].text == "Q: Tom has 3 apples and buys 4 more. How many apples does he have?\nA:"
    # the blank line 5 is skipped; ids keep the file's line numbers
    assert [p.prompt_id for p in prompts][3:5] == ["gsm8k_sample-line4", "gsm8k_sample-line6"]


def test_registry_uses_the_config_template():
    task = JsonlTaskConfig(path=str(SAMPLE))
    source = build_prompt_source(task, seed=0)
    assert len(source) == 8
    assert source[1].text == "Question: A box holds 12 pens. How many pens are in 5 boxes?\nAnswer:"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "q", "answer": "no final answer"}', "line 2: answer has no '#### <number>'"),
        ('{"question": "q"}', "line 2: missing or empty string field 'answer'"),
        ('{"question": "", "answer": "#### 3"}', "line 2: missing or empty string field 'question'"),
        ('["q", "#### 3"]', "line 2: expected an object, got list"),
        ('{"question": "q", "answer": "#### 3"', "line 2: not valid JSON"),
        ('{"question": "q", "answer": "#### three"}', "line 2: answer has no '#### <number>'"),
    ],
)
def test_bad_row_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "ok", "answer": "#### 1"}) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"bad\.jsonl: {message}"):
        load_gsm8k(path)


def test_missing_empty_and_wrongly_named_files(tmp_path):
    with pytest.raises(ValueError, match="is not a file"):
        load_gsm8k(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="empty.jsonl: no rows"):
        load_gsm8k(tmp_path / "empty.jsonl")
    (tmp_path / "rows.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"must end in \.jsonl or \.parquet"):
        load_gsm8k(tmp_path / "rows.csv")


def test_parquet_rows_match_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    path = tmp_path / "sample.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    from_parquet = load_gsm8k(path)
    assert [p.reference for p in from_parquet] == [p.reference for p in load_gsm8k(SAMPLE)]
    assert from_parquet[0].prompt_id == "sample-row0"
