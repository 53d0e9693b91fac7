"""End to end on a private Ray cluster bound to loopback: ``aisrl train`` writes every artefact,
the ledger balances, no sample exceeds ``max_lag``, a second run into the same directory is refused.

(``--resume`` through the CLI: ``test_jobs``' resubmission runs ``aisrl train --resume`` on a
cluster and checks the continued steps and ledger; exactness of a resume: ``test_resume_exact``,
whose runs are also the synchronous-mode check, ``max_lag`` 0.)

Runs the real stack: vLLM (CPU, FP8 per-channel), a 2-rank FSDP2 learner on gloo, the
correction service and W&B offline. Each run is a subprocess, so its Ray cluster is its own.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import ray
import torch
from typer.testing import CliRunner

from actors.cli import app
from actors.run_temp import compile_cache_name
from system import shared_segment

pytestmark = [pytest.mark.ray, pytest.mark.own_cluster, pytest.mark.vllm, pytest.mark.slow]

SMALL = ["prompts_per_step=4", "rollout.group_size=4", "rollout.prompts_per_call=2",
         "model.warm_start_steps=20", "report.dump_every=2", "checkpoint_every=2", "report.console=false"]
ONE_RANK = "learner.num_ranks=1"
"""For the runs whose claim is the run's end (a divergence, a correction that keeps nothing), not the
learner group: a rank fewer to start (~14 CPU seconds of a 2-core AMD EPYC VM's suite per rank). The
two-rank learner runs end to end in the first test and in ``test_resume_exact``."""


FAKE_KEY = "fake-wandb-key-" + "5ecre7" * 5  # planted: must appear in no artefact or log


def aisrl(*args: str, cache: Path, rc: int = 0, listeners: set | None = None,
          temp_dir: Path | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess; with ``listeners``, collect (process, address) of every listening
    socket in the run's whole process tree (Ray, learner ranks, vLLM, service, W&B) while it runs; with
    ``temp_dir``, that is the run's system temp dir (``TMPDIR``)."""
    env = {**os.environ, "AISRL_CACHE_DIR": str(cache), "WANDB_MODE": "offline", "WANDB_API_KEY": FAKE_KEY}
    if temp_dir is not None:
        env["TMPDIR"] = str(temp_dir)
    cmd = [sys.executable, "-c", "from actors.cli import app; app()", *args]
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr, text=True)
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            if listeners is not None:
                listeners |= listening_sockets(proc.pid)
            time.sleep(0.25)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        stdout.seek(0)
        stderr.seek(0)
        out = subprocess.CompletedProcess(cmd, proc.returncode, stdout.read(), stderr.read())
    assert out.returncode == rc, out.stdout[-3000:] + out.stderr[-6000:]
    return out


def listening_sockets(pid: int) -> set[tuple[str, str, int]]:
    """(name, ip, port) of the sockets in LISTEN state of ``pid`` and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for p in procs:
        try:
            found |= {(p.name(), c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture
def private_temp():
    """A system temp dir for one run alone (its ``TMPDIR``), so nothing another test or process writes
    to /tmp meanwhile is taken for the run's; short, as Ray's socket paths (under it) must fit 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="aisrl-t", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def test_train_three_steps_and_refuse_a_second_run_into_its_directory(tmp_path, cache, private_temp):
    run = tmp_path / "run"
    listeners: set = set()
    first = aisrl("train", "max_steps=3", f"output_dir={run}", *SMALL, cache=cache, listeners=listeners,
                  temp_dir=private_temp)
    # found by probes: W&B left a directory per logged table and its socket directory in /tmp per run,
    # each vLLM engine a rendezvous file; the service and the workers now run with the run's temporary
    # directory, removed when it stops. What stays is shared, not per run: Ray's session directory (its
    # logs) and torch's compile cache (``actors.run_temp``'s link target, reused by every later run).
    assert {p.name for p in private_temp.iterdir()} <= {"ray", compile_cache_name()}
    assert FAKE_KEY not in first.stdout + first.stderr
    # every socket the run listened on is on loopback (the README's promise for private clusters)
    assert len(listeners) >= 3, listeners  # at least Ray's GCS, raylet and the learner's rendezvous
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for _, ip, _ in listeners), sorted(listeners)
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
        lag_counts = {k: v for k, v in r.items() if k.startswith("staleness/sequences_lag_")}
        # every lag up to max_lag is in every record, zeros too (a W&B summary keeps a key's last value)
        assert sum(lag_counts.values()) == r["learner/num_sequences"] and set(lag_counts) == {
            "staleness/sequences_lag_0", "staleness/sequences_lag_1"}, lag_counts
    # dump_every=2, and the last step is always dumped (a run shorter than dump_every has a report too)
    assert sorted(p.name for p in (run / "dumps").iterdir()) == ["step_000002.npz", "step_000003.npz"]
    assert {p.name for p in (run / "report").iterdir()} == {"summary.json", "samples.json", "report.html"}
    assert (run / "checkpoints" / "step_00000003" / "controller.pkl").is_file()
    assert list((run / "wandb").glob("offline-run-*"))
    ledger = json.loads((run / "ledger.json").read_text())
    assert ledger["trained"] == 3 * 4 and ledger["duplicates"] == 0
    assert ledger["issued"] == ledger["trained"] + ledger["dropped"] + ledger["in_flight"] + ledger["buffered"]

    # a new run into the same directory is refused and touches nothing
    before = {p: p.read_bytes() for p in (run / "config.json", run / "metrics.jsonl", run / "ledger.json")}
    refused = aisrl("train", "max_steps=2", f"output_dir={run}", *SMALL, cache=cache, rc=2)
    said = " ".join(refused.stderr.split())
    assert "already holds a run" in said and "--resume" in said
    assert {p: p.read_bytes() for p in before} == before

    check_export(run, tmp_path / "hf", cache)


def check_export(run: Path, out: Path, cache: Path) -> None:
    """`aisrl export`: the newest checkpoint's weights as a Hugging Face model directory, equal to the
    DCP checkpoint read by torch's own converter (``dcp_to_torch_save``), cast to bf16; trained, so
    not the run's initial model; a second export into it is refused without --overwrite."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    runner = CliRunner()
    env = {"AISRL_CACHE_DIR": str(cache)}
    done = runner.invoke(app, ["export", str(run), "--out", str(out)], env=env)
    assert done.exit_code == 0 and "exported step 3 (policy version 3)" in " ".join(done.output.split()), done.output
    assert json.loads((out / "aisrl_export.json").read_text())["step"] == 3
    exported = load_file(str(out / "model.safetensors"))
    dcp_to_torch_save(str(run / "checkpoints" / "step_00000003" / "learner"), str(out.parent / "ref.pt"))
    reference = torch.load(out.parent / "ref.pt", weights_only=False)["model"]
    assert set(exported) == set(reference) and exported
    assert all(torch.equal(exported[k], reference[k].to(torch.bfloat16)) for k in reference)
    [initial_dir] = [p for p in cache.iterdir() if p.name.startswith("tiny-")]
    initial = load_file(str(initial_dir / "model.safetensors"))
    assert any(not torch.equal(exported[k], initial[k].to(torch.bfloat16)) for k in reference)  # it trained
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    assert torch.equal(model.lm_head.weight, reference["lm_head.weight"].to(torch.bfloat16))  # loads as trained
    again = runner.invoke(app, ["export", str(run), "--out", str(out)], env=env)
    assert again.exit_code == 2 and "pass --overwrite" in " ".join(again.output.split())
    clobber = runner.invoke(app, ["export", str(run), "--out", str(run), "--overwrite"], env=env)  # (a review's)
    assert clobber.exit_code == 2 and "is the run directory" in " ".join(clobber.output.split()), clobber.output
    assert (run / "config.json").is_file() and (run / "checkpoints").is_dir()
    older = runner.invoke(app, ["export", str(run), "--out", str(out), "--step", "2", "--overwrite", "--dtype",
                                "float32"], env=env)
    assert older.exit_code == 0 and json.loads((out / "aisrl_export.json").read_text())["step"] == 2, older.output
    missing = runner.invoke(app, ["export", str(run), "--out", str(out.parent / "x"), "--step", "1"], env=env)
    assert missing.exit_code == 2 and "--step 1: " in " ".join(missing.output.split())
    # a damaged newest checkpoint is passed over, as a resume does (its shard cut short)
    shard = sorted((run / "checkpoints" / "step_00000003" / "learner").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    fallback = runner.invoke(app, ["export", str(run), "--out", str(out), "--overwrite"], env=env)
    assert fallback.exit_code == 0 and "exported step 2" in " ".join(fallback.output.split()), fallback.output
    damaged = runner.invoke(app, ["export", str(run), "--out", str(out), "--overwrite", "--step", "3"], env=env)
    assert damaged.exit_code == 2 and "cannot be read whole" in " ".join(damaged.output.split()), damaged.output


def test_a_diverged_run_stops_with_an_error_and_no_non_finite_checkpoint(tmp_path, cache):
    """lr = 1e30 makes the parameters overflow within a few updates. The update that leaves a
    non-finite parameter stops the run at once (exit 1, after its record: it is the last line of
    metrics.jsonl, ``learner/nonfinite_params`` 1), whatever ``max_nonfinite_steps`` says, and no
    step from it on is checkpointed (checkpoint_every = 1). (Steps with a non-finite loss, gradient
    or log-prob and finite parameters count against ``max_nonfinite_steps``: test_learner_divergence.)"""
    run = tmp_path / "diverged"
    out = aisrl("train", "max_steps=8", f"output_dir={run}", "learner.lr=1e30", "learner.max_nonfinite_steps=3", ONE_RANK,
                *[a for a in SMALL if not a.startswith("checkpoint_every")], "checkpoint_every=1", cache=cache, rc=1)
    recs = records(run)
    last = recs[-1]["step"]
    assert f"training diverged: step {last}'s update left non-finite parameters" in " ".join(out.stderr.split())
    assert [r["learner/nonfinite_params"] for r in recs] == [0.0] * (len(recs) - 1) + [1.0]
    assert last < 8
    root = run / "checkpoints"
    saved = sorted(int(p.name.split("_")[1]) for p in root.iterdir()) if root.is_dir() else []
    assert saved == list(range(1, last))  # every step before the divergence, none from it on


def test_a_correction_that_keeps_nothing_stops_the_run(tmp_path, cache):
    """A Seq-MIS band [0.999999, 1.000001] rejects every response of an FP8 run (a response's
    log-ratio sum would have to lie within 1e-6 of 0; the default run's kl_k1 is ~0.04 per token):
    each step trains nothing. With ``max_nothing_kept_steps`` 1 the second such step stops the run
    (exit 1), after its record, the message naming steps 1-2.

    The run's weights go over ``weight_sync.type=collective`` (not a run of its own: the suite's time):
    on one host rank 0 exports each version straight into the broadcast's shared segment, and the
    real vLLM worker receives it from there."""
    run = tmp_path / "starved"
    out = aisrl("train", "max_steps=6", f"output_dir={run}", "correction.method.hi=1.000001",
                "correction.method.lo=0.999999", "correction.max_nothing_kept_steps=1", ONE_RANK, *SMALL,
                "weight_sync.type=collective", cache=cache, rc=1)
    said = " ".join(out.stderr.split())
    assert ("the correction kept no token for 2 consecutive steps (steps 1-2; method seq-mis "
            "self_normalize=False hi=1.000001 lo=0.999999") in said, said[-2000:]
    assert [(r["step"], r["correction/keep_token_frac"]) for r in records(run)] == [(1, 0.0), (2, 0.0)]
    # the stopped run's report (a review: a guard's stop left none), of its last batch, step 2
    assert (run / "report" / "report.html").is_file()
    assert sorted(p.name for p in (run / "dumps").glob("step_*.npz")) == ["step_000002.npz"]
    # the last version was broadcast through the segment it was exported into (sockets and a copy where
    # /dev/shm is missing); the first one too, unless the worker's generation formed after its export;
    # no lent version waited out ``lend_wait_s`` (Ray's copy of each was released before the next)
    shm = int(shared_segment.available())
    sync = [(r["weight_sync/broadcast_receivers"], r["weight_sync/broadcast_failed"],
             r["weight_sync/broadcast_shared_memory"], r["weight_sync/broadcast_in_place"]) for r in records(run)]
    assert sync[1] == (1, 0, shm, shm) and sync[0] in ((1, 0, shm, shm), (1, 0, shm, 0), (0, 0, 0, 0)), sync
    assert all(r["weight_sync/broadcast_segment_moves"] == 0 for r in records(run))
    # the drift alarm (keep_seq_frac 0 < 0.8) is the service's line, printed through Ray with its
    # actor's prefix; off a terminal without colour codes (a probe found them in a redirected log)
    assert "(CorrectionService pid=" in out.stderr and "\x1b[" not in out.stdout + out.stderr


@pytest.mark.parametrize(
    ("override", "needle"),
    [("learner.num_rank=2", "learner.num_rank"), ("max_steps=abc", "max_steps"),
     ("learner.num_ranks=3", "learner.num_ranks (3) must divide")],
)
def test_config_errors_fail_before_any_actor_starts(tmp_path, override, needle):
    result = CliRunner().invoke(app, ["train", override, f"output_dir={tmp_path / 'r'}"])
    assert result.exit_code == 2 and needle in result.output
    assert not ray.is_initialized() and not (tmp_path / "r").exists()
