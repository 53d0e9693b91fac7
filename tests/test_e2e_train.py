"""End to end on a private Ray cluster bound to loopback: ``aisrl train`` writes every artefact,
``--resume`` continues at the next step, the ledger balances and no sample exceeds ``max_lag``.

Runs the real stack: vLLM (CPU, FP8 per-channel), a 2-rank FSDP2 learner on gloo, the
correction service and W&B offline. Each run is a subprocess, so its Ray cluster is its own.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from actors.cli import app

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

SMALL = ["prompts_per_step=4", "rollout.group_size=4", "rollout.prompts_per_call=2",
         "model.warm_start_steps=20", "report.dump_every=2", "checkpoint_every=2", "report.console=false"]


FAKE_KEY = "fake-wandb-key-" + "5ecre7" * 5  # planted: must appear in no artefact or log


def aisrl(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "AISRL_CACHE_DIR": str(cache), "WANDB_MODE": "offline", "WANDB_API_KEY": FAKE_KEY}
    cmd = [sys.executable, "-c", "from actors.cli import app; app()", *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def test_train_three_steps_then_resume(tmp_path, cache):
    run = tmp_path / "run"
    first = aisrl("train", "max_steps=3", f"output_dir={run}", *SMALL, cache=cache)
    assert FAKE_KEY not in first.stdout + first.stderr
    leaks = [p for p in run.rglob("*") if p.is_file() and FAKE_KEY.encode() in p.read_bytes()]
    assert leaks == []

    config = json.loads((run / "config.json").read_text())
    assert config["max_steps"] == 3 and config["correction"]["method"]["type"] == "seq-mis"
    recs = records(run)
    assert [r["step"] for r in recs] == [1, 2, 3]
    required = ["policy_version", "reward/mean", "mismatch/kl_k1", "mismatch/ess_seq", "mismatch/nonfinite_tokens",
                "correction/keep_seq_frac", "ais/alpha", "staleness/lag_mean", "staleness/lag_max",
                "time/step", "throughput/learner_tokens_per_s"]
    for r in recs:
        assert all(k in r for k in required), [k for k in required if k not in r]
        assert r["policy_version"] == r["step"]
        assert r["staleness/lag_max"] <= 1  # async.max_lag defaults to 1
    assert sorted(p.name for p in (run / "dumps").iterdir()) == ["step_000002.npz"]
    assert {p.name for p in (run / "report").iterdir()} == {"summary.json", "samples.json", "report.html"}
    assert (run / "checkpoints" / "step_00000003" / "controller.pkl").is_file()
    assert list((run / "wandb").glob("offline-run-*"))
    ledger = json.loads((run / "ledger.json").read_text())
    assert ledger["trained"] == 3 * 4 and ledger["duplicates"] == 0
    assert ledger["issued"] == ledger["trained"] + ledger["dropped"] + ledger["in_flight"] + ledger["buffered"]

    aisrl("train", "--resume", str(run), "max_steps=5", cache=cache)
    recs = records(run)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    assert recs[3]["policy_version"] == 4
    ledger = json.loads((run / "ledger.json").read_text())
    assert ledger["trained"] == 5 * 4 and ledger["duplicates"] == 0


def test_synchronous_mode_trains_only_fresh_samples(tmp_path, cache):
    run = tmp_path / "sync"
    aisrl("train", "max_steps=3", "async.max_lag=0", f"output_dir={run}", "checkpoint_every=0",
          *[a for a in SMALL if not a.startswith("checkpoint_every")], cache=cache)
    assert [r["staleness/lag_max"] for r in records(run)] == [0, 0, 0]


@pytest.mark.parametrize(
    ("override", "needle"),
    [("learner.num_rank=2", "learner.num_rank"), ("max_steps=abc", "max_steps"),
     ("learner.num_ranks=3", "learner.num_ranks (3) must divide")],
)
def test_config_errors_fail_before_any_actor_starts(tmp_path, override, needle):
    result = CliRunner().invoke(app, ["train", override, f"output_dir={tmp_path / 'r'}"])
    assert result.exit_code == 2 and needle in result.output
    assert not ray.is_initialized() and not (tmp_path / "r").exists()
