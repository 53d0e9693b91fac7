"""Metric sinks: JSONL records, the run logger's one-record-per-step merge, and W&B that never
stops training (offline files written; an unreachable server is said once and skipped)."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from system.config.report import ReportConfig, WandbConfig
from system.report.run_logger import RunLogger, worst_sequences_table
from system.report.sinks import JsonlSink
from system.report.wandb_sink import WandbSink
from system.types import CorrectionInput


def test_jsonl_sink_writes_null_for_non_finite(tmp_path):
    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.log(3, {"a": 1.5, "b": float("nan"), "c": np.float32(2.0), "d": None})
    sink.close()
    assert json.loads((tmp_path / "m.jsonl").read_text()) == {"step": 3, "a": 1.5, "b": None, "c": 2.0, "d": None}


def test_jsonl_sink_writes_strict_json_at_any_depth(tmp_path):
    """Found by a probe: nested non-finite values were written as NaN / Infinity (not JSON), and a 0-d
    array or a tensor raised TypeError."""
    import torch

    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.log(2, {"nested": {"x": float("nan"), "y": [1.0, float("inf")]}, "zero_d": np.float32(0.5) * np.ones(()),
                 "tensor": torch.tensor(2.5), "vector": torch.tensor([1.0, float("-inf")])})
    sink.close()
    line = (tmp_path / "m.jsonl").read_text().strip()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) == {
        "step": 2, "nested": {"x": None, "y": [1.0, None]}, "zero_d": 0.5, "tensor": 2.5, "vector": [1.0, None]}


def test_jsonl_sink_refuses_to_write_on_once_its_file_is_removed_or_replaced(tmp_path):
    """Found by a probe: metrics.jsonl deleted mid-run, the sink went on writing into the unlinked
    file, and every later record was lost without a word."""
    path = tmp_path / "m.jsonl"
    sink = JsonlSink(path)
    sink.log(1, {"a": 1.0})
    path.unlink()
    with pytest.raises(FileNotFoundError, match=r"m\.jsonl was removed or replaced while the run wrote it: the "
                                                r"records from step 2 on have no file"):
        sink.log(2, {"a": 2.0})
    sink.close()
    replaced = JsonlSink(path)
    replaced.log(1, {"a": 1.0})
    path.rename(tmp_path / "old.jsonl")
    path.write_text("")
    with pytest.raises(FileNotFoundError, match="removed or replaced"):
        replaced.log(2, {"a": 2.0})
    replaced.close()


def test_run_logger_writes_each_step_record_as_one_line(tmp_path):
    cfg = ReportConfig(dump_every=2, wandb=WandbConfig(mode="disabled"))
    logger = RunLogger(tmp_path, cfg, {"seed": 0})
    record = logger.finish_step(1, {"mismatch/kl_k1": 0.01, "reward/mean": 0.5})
    logger.finish_step(2, {"reward/mean": 0.6})
    logger.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record == {"mismatch/kl_k1": 0.01, "reward/mean": 0.5}
    assert lines == [{"step": 1, "mismatch/kl_k1": 0.01, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.6}]
    assert [logger.should_dump(s) for s in (1, 2, 3, 4)] == [False, True, False, True]


def test_worst_sequences_table_orders_by_mean_abs_diff():
    batch = CorrectionInput(
        behaviour_BT=np.array([[-1.0, -1.0], [-1.0, -1.0], [-1.0, 0.0]], np.float32),
        proximal_BT=np.array([[-1.1, -1.1], [-3.0, -1.0], [-1.0, 0.0]], np.float32),
        mask_BT=np.array([[1, 1], [1, 1], [1, 0]], bool), lag_B=np.array([0, 1, 0], np.int32),
        advantage_B=np.zeros(3, np.float32), reward_B=np.array([0.5, 1.0, 0.0], np.float32),
        response_ids_BT=np.zeros((3, 2), np.int32), uids=("a", "b", "c"), prompt_texts=("",) * 3,
        response_texts=("x", "y", "z"))
    cols, rows = worst_sequences_table(batch)
    # mean |d|: a = 0.1, b = (2 + 0) / 2 = 1.0, c = 0.
    assert [r[0] for r in rows] == ["b", "a", "c"]
    assert rows[0][cols.index("mean_abs_diff")] == pytest.approx(1.0)
    assert rows[0][cols.index("lag")] == 1 and rows[0][cols.index("response")] == "y"
    # a non-finite token is not a valid one: c's mean |d| is over its one valid token (|-0.5 - 0| = 0.5),
    # not halved by the NaN beside it, and its length is that one token
    batch.proximal_BT[2] = [-0.5, np.nan]
    batch.mask_BT[2] = [1, 1]
    cols, rows = worst_sequences_table(batch)
    assert [r[0] for r in rows] == ["b", "c", "a"]
    assert rows[1][cols.index("mean_abs_diff")] == pytest.approx(0.5)
    assert rows[1][cols.index("length")] == 1


def test_wandb_offline_writes_a_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    sink = WandbSink("offline", "aisrl-test", tmp_path, {"seed": 0})
    assert sink.run is not None and not sink.failed
    sink.log(1, {"reward/mean": 0.5, "missing": None})
    sink.log_histogram(1, "ratio", np.exp(np.random.default_rng(0).normal(0, 0.1, 500)))
    sink.log_table(1, "worst", ["uid", "x"], [["a", 1.0]])
    sink.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_wandb_unreachable_is_said_once_and_training_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # closed loopback port
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    with caplog.at_level(logging.WARNING):
        sink = WandbSink("online", "aisrl-test", tmp_path, {"seed": 0}, init_timeout_s=5)
        sink.log(1, {"reward/mean": 0.5})
        sink.log_histogram(1, "ratio", np.ones(3))
        sink.close()
    assert sink.failed and sink.run is None
    assert sum("W&B failed" in r.message for r in caplog.records) == 1


class _AlertRun:
    """Records ``alert`` calls; raises while ``broken``."""

    def __init__(self):
        self.alerts, self.broken = [], False

    def alert(self, title, text, level=None, wait_duration=None):
        if self.broken:
            raise RuntimeError("alerts are off")
        self.alerts.append((title, text))


def test_wandb_alert_is_rate_limited_per_title_and_never_raises(tmp_path, caplog):
    sink = WandbSink("disabled", "aisrl-test", tmp_path, {})
    assert sink.alert("drift: staleness", "x", step=1) is False  # no run: nothing to alert
    sink.run = run = _AlertRun()
    sent = [sink.alert("drift: staleness", f"step {s}", step=s) for s in (1, 5, 10, 11, 21)]
    assert sent == [True, False, False, True, True]  # at most one per title within 10 steps
    assert sink.alert("drift: lag-0 mismatch", "other cause", step=5) is True  # another title: its own limit
    assert sink.alert("drift: staleness", "no step", step=None) is True  # without a step: not limited
    assert [t for _, t in run.alerts] == ["step 1", "step 11", "step 21", "other cause", "no step"]
    run.broken = True
    with caplog.at_level(logging.WARNING):
        assert sink.alert("drift: staleness", "a", step=40) is False
        assert sink.alert("drift: staleness", "b", step=41) is False  # a failed alert does not start the limit
    assert sum("W&B alert failed" in r.message for r in caplog.records) == 1
    assert sink.run is run and not sink.failed  # the run keeps logging


def test_the_alert_rate_limit_survives_a_resume(tmp_path):
    """Found by a review: the steps of the last alerts were not checkpointed, so a resumed run could
    alert a second time for one cause within 10 steps. The state goes with the checkpoint and back."""
    sink = WandbSink("disabled", "aisrl-test", tmp_path, {})
    sink.run = _AlertRun()
    assert sink.alert("drift: staleness", "x", step=30)
    saved = sink.alert_state()
    assert saved == {"drift: staleness": 30}
    resumed = WandbSink("disabled", "aisrl-test", tmp_path, {})
    resumed.run = _AlertRun()
    resumed.load_alert_state(saved)
    assert [resumed.alert("drift: staleness", "y", step=s) for s in (32, 39, 40)] == [False, False, True]
    resumed.load_alert_state(None)  # a checkpoint from before: no limit carried
    assert resumed.alert_state() == {}


def test_an_alarm_the_stopped_attempt_alerted_counts_for_the_rate_limit_after_a_resume(tmp_path):
    """Found by a review: checkpoint at step 10, the first attempt alerted an alarm at step 12 and went on
    to step 14 (W&B holds 1-14); the resumed run re-trains 11-14 without alerting, but its alarm at 15
    was sent: two alerts for one cause 3 steps apart. The re-trained step 12 now counts (15 - 12 < 10),
    and 22 is sent (22 - 12 >= 10). A replayed step the first attempt held back (within 10 of its last)
    does not move the limit."""
    cfg = ReportConfig(dump_every=0, wandb=WandbConfig(mode="disabled"))
    logger = RunLogger(tmp_path, cfg, {}, wandb_run_id="abc", live_sent_through=14)
    logger.wandb.run = run = _AlertRun()
    logger.wandb.load_alert_state({})  # the checkpoint at 10 held no alert
    assert [logger.alert("drift: staleness", f"step {s}", s) for s in (12, 13, 15, 22)] == [False, False, False, True]
    assert [t for _, t in run.alerts] == ["step 22"]
    assert logger.wandb.alert_state() == {"drift: staleness": 22}
    logger.close()


_TEMP_DIRS_PROBE = """
import json, os, sys, tempfile
tempfile.tempdir = sys.argv[2]  # this process's system temp dir: the test's own
from system.report.wandb_sink import WandbSink, remove_process_temp_dirs
off = WandbSink("disabled", "aisrl-test", sys.argv[1], {})
imported_when_off = "wandb" in sys.modules
sink = WandbSink("offline", "aisrl-test", sys.argv[1], {"seed": 0})
sink.log_histogram(1, "h", [0.0, 1.0])
sink.close()
made = sorted(os.listdir(sys.argv[2]))
removed = remove_process_temp_dirs()
print(json.dumps({"imported_when_off": imported_when_off, "made": made, "removed": removed,
                  "left": sorted(os.listdir(sys.argv[2]))}))
os._exit(0)  # as a Ray actor ends: no interpreter exit, so nothing of wandb's cleans up after this
"""


def test_wandb_is_imported_only_by_a_logging_sink_and_leaves_no_temp_dirs(tmp_path):
    """wandb's import makes two process-wide temporary directories that it removes only at interpreter
    exit, which a Ray actor never reaches: the correction service's close removes them. Probed in a
    fresh interpreter whose temp dir is the test's (so the test sees exactly what it made)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _TEMP_DIRS_PROBE, str(tmp_path / "run"), str(temp)], cwd=root,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "WANDB_MODE": "offline", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["imported_when_off"] is False  # a disabled sink never imports wandb
    assert any(name.endswith("wandb-media") for name in seen["made"]), seen  # what the import made
    assert sorted(Path(p).name for p in seen["removed"]) == [n for n in seen["made"] if "wandb" in n]
    assert seen["left"] == [n for n in seen["made"] if "wandb" not in n] and sorted(os.listdir(temp)) == seen["left"]


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log(self, step, metrics):
        self.calls.append(("log", step, dict(metrics)))

    def log_histogram(self, step, name, values):
        self.calls.append(("histogram", step, name))

    def log_table(self, step, name, columns, rows):
        self.calls.append(("table", step, name))

    def close(self):
        pass


def test_live_sinks_receive_each_step_once_in_the_order_steps_finish(tmp_path):
    """Found by a review: with queue-ahead the learner starts step 2 (its correction metrics and dump
    reach the service) before the driver's record of step 1 arrives; streamed at once, step 2 went to
    W&B first and W&B then ignored all of step 1 (a step lower than one already logged)."""
    from system.types import CorrectionInput

    sink = RecordingSink()
    logger = RunLogger(tmp_path, ReportConfig(dump_every=2, wandb=WandbConfig(mode="disabled")), {}, extra_sinks=[sink])
    batch = CorrectionInput(
        behaviour_BT=np.full((2, 2), -1.0, np.float32), proximal_BT=np.full((2, 2), -1.1, np.float32),
        mask_BT=np.ones((2, 2), bool), lag_B=np.zeros(2, np.int32), advantage_B=np.zeros(2, np.float32),
        reward_B=np.zeros(2, np.float32), response_ids_BT=np.zeros((2, 2), np.int32), uids=("a", "b"),
        prompt_texts=("", ""), response_texts=("x", "y"))
    logger.dump(2, batch, np.ones(4))  # the next step's correction and dump, queued ahead
    assert sink.calls == []  # nothing live before its step finishes
    logger.finish_step(1, {"mismatch/kl_k1": 0.1, "reward/mean": 0.5})
    logger.finish_step(2, {"mismatch/kl_k1": 0.2, "reward/mean": 0.6})
    logger.close()
    assert sink.calls == [("log", 1, {"mismatch/kl_k1": 0.1, "reward/mean": 0.5}),
                          ("log", 2, {"mismatch/kl_k1": 0.2, "reward/mean": 0.6}),
                          ("histogram", 2, "mismatch/token_ratio"), ("table", 2, "mismatch/worst_sequences")]


def test_wandb_gets_the_step_as_a_value_and_a_bad_histogram_is_a_wandb_failure(tmp_path, monkeypatch):
    """W&B drops (with a warning only) a record whose ``step=`` is lower than one already logged: a
    resumed run re-trains the steps after its checkpoint. The step travels as ``train/step``, the
    x-axis of every chart, and W&B's own counter only grows. A histogram W&B refuses (non-finite
    values) is said once and never raised into training."""
    from system.report import wandb_sink

    monkeypatch.setenv("HOME", str(tmp_path))
    sink = WandbSink("offline", "aisrl-test", tmp_path, {"seed": 0})
    logged = []
    real_log = sink.run.log

    def spy(payload, *args, **kwargs):
        logged.append((dict(payload), args, kwargs))
        return real_log(payload, *args, **kwargs)

    monkeypatch.setattr(sink.run, "log", spy)
    sink.log(7, {"reward/mean": 0.5})
    sink.log(3, {"reward/mean": 0.4})  # a resumed run's earlier step
    assert [(p[wandb_sink.STEP_KEY], p["reward/mean"], a, k) for p, a, k in logged] == [(7, 0.5, (), {}), (3, 0.4, (), {})]
    sink.log_histogram(4, "ratio", np.array([1.0, np.inf]))
    assert sink.failed and sink.run is None  # said once; training goes on
    sink.close()


def _two_row_batch():
    from system.types import CorrectionInput

    return CorrectionInput(
        behaviour_BT=np.full((2, 2), -1.0, np.float32), proximal_BT=np.full((2, 2), -1.1, np.float32),
        mask_BT=np.ones((2, 2), bool), lag_B=np.zeros(2, np.int32), advantage_B=np.zeros(2, np.float32),
        reward_B=np.zeros(2, np.float32), response_ids_BT=np.zeros((2, 2), np.int32), uids=("a", "b"),
        prompt_texts=("", ""), response_texts=("x", "y"))


def test_a_resumed_run_sends_w_and_b_only_the_steps_its_first_attempt_did_not(tmp_path):
    """Found by a probe: a resume from step 20 after a stop at step 26 sent steps 21-26 again to the
    same W&B run; every chart (against ``train/step``) then had two different points at each of them
    (347 conflicting values). metrics.jsonl gets every step; W&B keeps the first attempt's."""
    sink = RecordingSink()
    cfg = ReportConfig(dump_every=0, wandb=WandbConfig(mode="disabled"))
    logger = RunLogger(tmp_path, cfg, {}, wandb_run_id="abc", extra_sinks=[sink], live_sent_through=3)
    alerts = []
    logger.wandb.alert = lambda title, text, step=None: alerts.append(step) or True
    for step in (2, 3, 4):  # resumed from the checkpoint of step 1; the first attempt sent 1-3
        logger.alert("drift", "x", step)  # nor its alarms again
        logger.finish_step(step, {"reward/mean": step / 10})
    logger.close()
    assert alerts == [4]
    assert sink.calls == [("log", 4, {"reward/mean": 0.4})]
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [2, 3, 4]
    # a run without a W&B run to continue (W&B was off, or this is its first attempt) sends every step
    fresh = RecordingSink()
    logger = RunLogger(tmp_path / "new", cfg, {}, extra_sinks=[fresh], live_sent_through=3)
    logger.finish_step(2, {"reward/mean": 0.2})
    logger.close()
    assert fresh.calls == [("log", 2, {"reward/mean": 0.2})]


def test_the_last_steps_dump_made_after_its_record_still_reaches_w_and_b(tmp_path):
    """Found by a probe: the run's last step, dumped when the run ends (``report.dump_every`` skipped it),
    queued its histogram and table behind a record that had already been sent: they never reached W&B."""
    sink = RecordingSink()
    logger = RunLogger(tmp_path, ReportConfig(dump_every=7, wandb=WandbConfig(mode="disabled")), {},
                       extra_sinks=[sink])
    logger.finish_step(1, {"reward/mean": 0.5})
    logger.dump(1, _two_row_batch(), np.ones(4))  # the end of the run: write_report dumps step 1 now
    logger.close()
    assert sink.calls == [("log", 1, {"reward/mean": 0.5}), ("histogram", 1, "mismatch/token_ratio"),
                          ("table", 1, "mismatch/worst_sequences")]
    assert (tmp_path / "dumps" / "step_000001.npz").is_file()
