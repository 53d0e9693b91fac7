"""GSM8K-style files: references after the last ``####``, and bad rows named by file and line."""

import json
import re
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
        ('{"question": "q", "answer": "no final answer"}', "line 2: answer must end in '#### <number>'"),
        ('{"question": "q"}', "line 2: missing or empty string field 'answer'"),
        ('{"question": "", "answer": "#### 3"}', "line 2: missing or empty string field 'question'"),
        ('["q", "#### 3"]', "line 2: expected an object, got list"),
        ('{"question": "q", "answer": "#### 3"', "line 2: not valid JSON"),
        ('{"question": "q", "answer": "#### three"}', "line 2: answer must end in '#### <number>'"),
        # found by a review: each was read loosely as a wrong label (3, 1, 12) and trained against
        ('{"question": "q", "answer": "#### 3/4"}', "line 2: answer must end in .*'3/4'"),
        ('{"question": "q", "answer": "#### 1e3"}', "line 2: answer must end in .*'1e3'"),
        ('{"question": "q", "answer": "####\\n\\nThe answer is 12"}', "line 2: answer must end in .*The answer is 12"),
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


def test_final_answers_with_a_dollar_sign_comma_or_full_stop_are_read(tmp_path):
    path = tmp_path / "ok.jsonl"
    answers = ["#### $1,234", "#### 72.", "so... #### 7 ####  -3.50 ", "#### 0.5"]
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": a}) + "\n" for i, a in enumerate(answers)))
    assert [p.reference for p in load_gsm8k(path)] == ["1234", "72", "-3.5", "0.5"]


def test_non_utf8_bytes_name_the_line_and_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = json.dumps({"question": "ok", "answer": "#### 1"}).encode()
    path.write_bytes(b"\xef\xbb\xbf" + good + b"\n" + good + b"\n" + b'{"question": "caf\xe9", "answer": "#### 2"}\n')
    with pytest.raises(ValueError, match=r"latin1\.jsonl: line 3: not UTF-8 \(byte 0xe9 at column 18\)"):
        load_gsm8k(path)
    path.write_bytes(b"\xef\xbb\xbf" + good + b"\n")  # a BOM (written by some editors) is not data
    assert [p.reference for p in load_gsm8k(path)] == ["1"]


@pytest.mark.parametrize(("template", "message"), [
    ("Solve this.", "must hold the placeholder {question}"),  # every prompt the same text
    ('{"x": 1} {question}', "must hold the placeholder {question} and no other"),
    ("{0} {question}", "and no other"),
    ("{question", "prompt_template: "),
])
def test_a_template_without_exactly_the_question_placeholder_is_refused(template, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        JsonlTaskConfig(path="x.jsonl", prompt_template=template)
    assert JsonlTaskConfig(path="x.jsonl", prompt_template="{{json}}: {question}").prompt_template


def test_a_chat_prompt_needs_a_tokenizer_with_a_template():
    from system.rollout.chat import as_engine_prompts, chat_prompt_ids, check_chat_template

    class Base:
        chat_template = None

    with pytest.raises(ValueError, match=r"data\.task\.chat_template=true, but the model's tokenizer has no chat"):
        check_chat_template(Base())
    with pytest.raises(ValueError, match="no chat template"):
        chat_prompt_ids(Base(), "q")
    assert as_engine_prompts(["a", [1, 2]]) == ["a", {"prompt_token_ids": [1, 2]}]
    assert JsonlTaskConfig(path="x.jsonl").chat_template is False


def test_rows_no_tokenizer_can_encode_or_json_beyond_the_parser_are_refused_naming_the_line(tmp_path):
    """Found by a probe: a question with a lone surrogate (JSON's "\\ud83d") loaded, and the run failed
    at its first checkpoint; a 5000-digit integer or deep nesting raised without the file and line."""
    path = tmp_path / "odd.jsonl"
    good = json.dumps({"question": "ok", "answer": "#### 1"})
    for bad, needle in (('{"question": "what is \\ud83d 2+3", "answer": "#### 5"}', "lone UTF-16 surrogate"),
                        ('{"question": "q", "answer": "#### 5", "n": ' + "9" * 5000 + "}", "beyond the parser's limits"),
                        ("[" * 100_000, "beyond the parser's limits")):
        path.write_text(good + "\n" + bad + "\n")
        with pytest.raises(ValueError, match=rf"odd\.jsonl: line 2: .*{re.escape(needle)}"):
            load_gsm8k(path)


@pytest.mark.parametrize("template", ["Q: {question:>{width}}", "Q: {question:d}", "Q: {question!x}", "Q: {question!r}"])
def test_a_placeholder_with_a_format_spec_or_conversion_is_refused(template):
    """Found by a probe: these passed the config and --dry-run, then failed (KeyError / ValueError) when
    the first prompt was made, without naming data.task.prompt_template."""
    with pytest.raises(ValueError, match=r"prompt_template: write the placeholder as plain \{question\}"):
        JsonlTaskConfig(path="x.jsonl", prompt_template=template)


def test_a_key_twice_in_a_row_and_loose_labels_are_refused(tmp_path):
    """Found by a probe: a row with two "answer" keys kept the last silently; '#### 1,,,,2' was read as 12
    and '#### 5,' as 5."""
    path = tmp_path / "loose.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1", "answer": "#### 2"}\n')
    with pytest.raises(ValueError, match=r"loose\.jsonl: line 1: key 'answer' appears twice in one object"):
        load_gsm8k(path)
    for label in ("1,,,,2", "5,", "1000,000"):
        path.write_text(json.dumps({"question": "q", "answer": f"#### {label}"}) + "\n")
        with pytest.raises(ValueError, match=r"line 1: answer must end in '#### <number>'"):
            load_gsm8k(path)
    path.write_text(json.dumps({"question": "q", "answer": "so #### 1,234,567"}) + "\n")
    assert [p.reference for p in load_gsm8k(path)] == ["1234567"]


def test_a_question_given_twice_is_kept_and_counted_and_a_second_answer_is_named(tmp_path, caplog):
    """Found by a probe: the same question with two different answers loaded without a word (one copy is
    always rewarded against a wrong label)."""
    rows = [("q1", "#### 1"), ("q2", "#### 2"), ("q1", "#### 1"), ("q2", "#### 3"), ("q3", "#### 4")]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    with caplog.at_level("WARNING", logger="system.data.gsm8k"):
        prompts = load_gsm8k(path)
    assert [p.reference for p in prompts] == ["1", "2", "1", "3", "4"]  # every row kept, in order
    [record] = caplog.records
    assert ("d.jsonl: 2 rows repeat an earlier row's question, each kept; 1 with another answer (one of the "
            "labels is wrong: line 4 gives 3, line 2 2)") in record.getMessage()
    caplog.clear()
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows[:2]))
    with caplog.at_level("WARNING", logger="system.data.gsm8k"):
        load_gsm8k(path)
    assert not caplog.records  # no repeat, no warning
