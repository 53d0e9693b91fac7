"""``metrics.jsonl`` on a resume: records past the checkpoint and a cut last line dropped, a damaged
line before other records refused (``system.metrics_file``)."""

import json

import pytest

from system import metrics_file


def test_resume_trims_records_past_the_checkpoint_and_a_cut_last_line(tmp_path):
    lines = [json.dumps({"step": s, "loss": 0.1 * s}) for s in (1, 2, 3, 4)] + ['{"step": 5, "lo']  # cut by a kill
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    # a cut last line is what a stop leaves: accepted; no record says W&B took it, so nothing was sent
    assert metrics_file.wandb_sent_through(tmp_path) == 0
    assert metrics_file.trim_metrics(tmp_path, 2) == 3  # steps 3, 4 and the cut line
    kept = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [1, 2]
    assert metrics_file.trim_metrics(tmp_path, 2) == 0
    assert metrics_file.trim_metrics(tmp_path / "none", 2) == 0 and metrics_file.wandb_sent_through(tmp_path / "none") == 0
    # cut lines at the end before the checkpoint's step: dropped, the records before them kept
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": Infinity}\n{"st')
    assert metrics_file.trim_metrics(tmp_path, 2) == 2
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_records_logged_after_a_resume_trimmed_the_file_land_in_it(tmp_path):
    """The resumed run's metrics sink exists (the correction service is built) before the resume is
    accepted and the file trimmed (replaced): its records must still reach ``metrics.jsonl``."""
    from system.report.sinks import JsonlSink

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    assert metrics_file.trim_metrics(tmp_path, 2) == 1
    sink.log(3, {"loss": 0.5})
    sink.log(4, {"loss": 0.25})
    sink.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4] and records[-1]["loss"] == 0.25


@pytest.mark.parametrize("bad", ["this is not json", '{"step": 3, "lo', '{"step": Infinity}', "[3]", '{"loss": 1}',
                                 '{"step": 3.5}', '{"step": true}', '{"step": "3"}', ""])
def test_a_damaged_line_before_other_records_is_refused_and_nothing_dropped(tmp_path, bad):
    """Found by a probe: a damaged line in the middle of the file was deleted by the resume's trim
    (step 3 lost for good) and reported as a record "written after that checkpoint"."""
    text = "".join(json.dumps({"step": s}) + "\n" for s in (1, 2)) + bad + "\n" + \
        "".join(json.dumps({"step": s}) + "\n" for s in (4, 5, 6))
    (tmp_path / "metrics.jsonl").write_text(text)
    for call in (lambda: metrics_file.wandb_sent_through(tmp_path), lambda: metrics_file.trim_metrics(tmp_path, 6)):
        with pytest.raises(ValueError, match=r"metrics.jsonl: line 3 is not a step record .* repair or delete that line"):
            call()
    assert (tmp_path / "metrics.jsonl").read_text() == text  # untouched


def test_the_steps_w_and_b_holds_survive_the_trims_of_two_resumes(tmp_path):
    """A review of the first fix: read from metrics.jsonl alone, the mark was lost with the records a
    resume trims; a second stop and resume sent the steps between again. Records W&B did not take
    (``report/wandb_live`` 0: it had failed) do not count."""
    def write(steps, live):
        (tmp_path / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "report/wandb_live": int(s in live)}) + "\n" for s in steps))

    write(range(1, 27), live=range(1, 27))  # attempt 1: W&B took steps 1-26, checkpoint at 20
    assert metrics_file.wandb_sent_through(tmp_path) == 26
    metrics_file.trim_metrics(tmp_path, 20, wandb_sent=26)  # the resume's trim keeps the mark
    write(range(1, 24), live=range(1, 24))  # attempt 2 stops at 23
    assert metrics_file.wandb_sent_through(tmp_path) == 26
    write(range(1, 31), live=range(1, 5))  # W&B failed at step 5: the later records are not in it
    (tmp_path / metrics_file.WANDB_SENT_FILE).unlink()
    assert metrics_file.wandb_sent_through(tmp_path) == 4
    (tmp_path / metrics_file.WANDB_SENT_FILE).write_text("{damaged")
    assert metrics_file.wandb_sent_through(tmp_path) == 4
