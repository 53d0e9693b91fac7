"""FSDP2 on gloo: ``LearnerCore`` in 2 ranks against one process (CPU, spawned processes, loopback).

One scenario per (world size, param dtype) runs in spawned ranks (``fsdp_ranks``) and is shared by
the tests:

    export v0 -> proximal -> step 1 -> export v1 -> save checkpoint -> step 2 (stale old, r != 1)
    -> export v2 -> load checkpoint -> step 2 again -> export v2'

Tolerances: float32 params must match the naive one-process reference of ``test_learner_step``
to float32 rounding (rel 1e-5: only the summation order over ranks and micro-batches differs).
bfloat16 params: 2 ranks vs 1 rank are compared at rel 5e-3 on the loss, the gradient norm and
the entropy, about one bf16 rounding step (8 mantissa bits: 2**-8 ~ 4e-3). Both run the same
bf16 arithmetic per sequence; what differs is the fp32 summation order over ranks and
micro-batches, and after step 1 the bf16 rounding of weights that moved by different last
bits. Measured here: step 1 rel 2e-6 (loss) / 9e-6 (grad norm), step 2 rel 2e-4 / 6e-4.
bf16 against the fp32 reference: rel 5e-2 on the gradient norm (measured 8e-4, then 9e-3).
"""

import json
import os

import numpy as np
import pytest
import torch
from fsdp_ranks import GRAD_CLIP, LR, _learner_cfg, _resume_main, _run_ranks, _spawn
from test_learner_step import (
    make_batch,
    make_weights,
    naive_old_logprobs,
    reference_step,
    save_tiny_model,
)
from transformers import Qwen2ForCausalLM

from system.learner.checkpoint_files import is_complete
from system.weight_payload import decode_weights


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    cache = {}

    def get(world_size, param_dtype):
        if (world_size, param_dtype) not in cache:
            out = str(tmp_path_factory.mktemp(f"ranks{world_size}-{param_dtype}"))
            cache[world_size, param_dtype] = _run_ranks(world_size, param_dtype, model_dir, out)
        return cache[world_size, param_dtype]

    return get


@pytest.fixture(scope="module")
def reference(model_dir):
    """Naive one-process fp32 run of the same two steps: losses, norms, weights after each."""
    model = Qwen2ForCausalLM.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    batch = make_batch()
    old, weights = naive_old_logprobs(model, batch), make_weights(batch)
    out = {"old": old}
    for step in ("step1", "step2"):
        out[step] = reference_step(model, optimizer, batch, old, weights, GRAD_CLIP)
        out[f"{step}_weights"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return out


def test_two_ranks_fp32_match_one_process_reference(runs, reference):
    metrics, exports, old, _ = runs(2, "float32")
    np.testing.assert_allclose(old, reference["old"], atol=2e-6)
    for step in ("step1", "step2"):
        ref_loss, ref_norm = reference[step]
        assert metrics[step]["loss"] == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
        assert metrics[step]["grad_norm"] == pytest.approx(ref_norm, rel=1e-5)
    # The step moved the weights like the reference did (bf16 export: compare at one bf16 ulp).
    for name, ref_weight in reference["step1_weights"].items():
        np.testing.assert_allclose(exports["v1"][name], ref_weight.bfloat16().float().numpy(),
                                   rtol=2**-7, atol=1e-3 * LR, err_msg=name)
    assert metrics["step2"]["loss/clip_frac"] > 0.0, "step 2 should exercise the PPO clip"


def test_two_ranks_bf16_match_one_rank_bf16(runs, reference):
    two, _, old_two, _ = runs(2, "bfloat16")
    one, _, old_one, _ = runs(1, "bfloat16")
    np.testing.assert_allclose(old_two, old_one, atol=1e-3)
    for step in ("step1", "step2"):
        for key in ("loss", "grad_norm", "entropy"):
            assert two[step][key] == pytest.approx(one[step][key], rel=5e-3), (step, key)
        # ... and bf16 stays near the fp32 reference.
        assert two[step]["grad_norm"] == pytest.approx(reference[step][1], rel=5e-2)
    assert two["step1"]["num_valid_tokens"] == one["step1"]["num_valid_tokens"]


def test_checkpoint_round_trip_gives_identical_next_step(runs):
    metrics, exports, _, _ = runs(2, "float32")
    assert metrics["restored_version"] == 1
    assert metrics["step2_again"] == metrics["step2"]
    for name in exports["v2"]:
        np.testing.assert_array_equal(exports["v2_again"][name], exports["v2"][name], err_msg=name)
    assert metrics["v2_again_version"] == metrics["v2_version"] == 2


def test_fresh_core_resumes_from_a_two_rank_checkpoint_on_one_rank(runs, model_dir, tmp_path):
    """DCP reshards 2 -> 1 and fills a fresh AdamW; step 2 then matches the uninterrupted run."""
    metrics, exports, _, out_dir = runs(2, "float32")
    ckpt = os.path.join(out_dir, "ckpt", "step_00000001")
    _spawn(_resume_main, 1, model_dir, "float32", str(tmp_path), ckpt, os.path.join(out_dir, "old.npy"))
    with open(tmp_path / "metrics.json") as f:
        resumed = json.load(f)
    assert resumed["restored_version"] == 1
    for key in ("loss", "grad_norm", "lr"):
        assert resumed["step2"][key] == pytest.approx(metrics["step2"][key], rel=1e-5), key
    resumed_v2 = dict(np.load(tmp_path / "v2.npz"))
    for name, weight in exports["v2"].items():
        # bf16 exports of fp32 weights that agree to ~1e-7: equal, or one bf16 ulp apart.
        np.testing.assert_allclose(resumed_v2[name], weight, rtol=2**-7, atol=1e-3 * LR, err_msg=name)


def test_checkpoint_directory_is_published_complete(runs):
    root = os.path.join(runs(2, "float32")[3], "ckpt")
    assert is_complete(os.path.join(root, "step_00000001"))
    assert os.listdir(root) == ["step_00000001"]  # no .partial or .stale left behind


def test_export_is_the_unsharded_model_in_bf16(runs, model_dir):
    metrics, exports, _, _ = runs(2, "float32")
    original = Qwen2ForCausalLM.from_pretrained(model_dir).state_dict()
    assert set(exports["v0"]) == set(original) and "lm_head.weight" in exports["v0"]
    for name, weight in original.items():
        np.testing.assert_array_equal(exports["v0"][name], weight.bfloat16().float().numpy(), err_msg=name)
    assert metrics["v0_dtypes"] == ["bfloat16"] and metrics["v0_version"] == 0 and metrics["v1_version"] == 1


def _group_step_main(rank, world_size, port, model_dir, out_dir):
    """``run_step`` (the one-call step) on every rank: rank 0's correction call records what it sees."""
    from system.learner.core import LearnerCore
    from system.learner.group_step import run_step

    torch.set_num_threads(1)
    batch, weights = make_batch(), make_weights(make_batch())
    core = LearnerCore(_learner_cfg(world_size, "float32"), model_dir, rank, world_size, port)
    seen = {}
    forwards = []
    core.model.register_forward_hook(lambda *_: forwards.append(1))

    def correct(proximal_BT):  # as the Ray shell: the call starts here, its result is waited for later
        seen["proximal"], seen["forwards_at_start"] = proximal_BT, len(forwards)

        def wait():
            seen["forwards_at_wait"] = len(forwards)
            return weights, {"mismatch/kl_k1": 0.5}
        return wait

    outcome = run_step(core, batch, rank, world_size, correct if rank == 0 else None)
    # a negative weight in rank 1's rows only: every rank refuses the step together (rank 1 alone refusing
    # left rank 0 in the update's collectives until the process-group timeout; found by a review)
    bad = weights.copy()
    bad[-1, 0] = -1.0
    try:
        run_step(core, batch, rank, world_size, (lambda old: lambda: (bad, {})) if rank == 0 else None)
        refused = False
    except ValueError as exc:
        refused = "negative or non-finite" in str(exc)
    assert refused, f"rank {rank} did not refuse the bad weights"
    if rank == 0:
        np.save(os.path.join(out_dir, "seen_proximal.npy"), seen["proximal"])
        np.savez(os.path.join(out_dir, "v1.npz"), **{k: v.float().numpy() for k, v in decode_weights(outcome.payload)})
        with open(os.path.join(out_dir, "outcome.json"), "w") as f:
            json.dump({"learner": outcome.learner, "correction": outcome.correction,
                       "seconds": outcome.seconds, "version": outcome.payload.policy_version,
                       "forwards": [seen["forwards_at_start"], seen["forwards_at_wait"]]}, f)
    else:
        assert outcome.payload is None and outcome.correction == {}
    core.close()


def test_one_call_step_equals_the_step_by_parts(runs, model_dir, tmp_path):
    """``run_step`` on 2 ranks (all-gather of old, rank 0's correction call started, the update's first
    forward, the wait and the broadcast of the weights, the rest of the update, export) gives what the same parts called one by one give (``_rank_main``'s step 1,
    itself checked against the naive one-process reference): the same arithmetic, so equal."""
    metrics, exports, old, _ = runs(2, "float32")
    _spawn(_group_step_main, 2, model_dir, str(tmp_path))
    seen = np.load(tmp_path / "seen_proximal.npy")
    np.testing.assert_array_equal(seen, old)  # the global [B, T] old, rows in rank order
    with open(tmp_path / "outcome.json") as f:
        outcome = json.load(f)
    assert outcome["version"] == 1 and outcome["correction"] == {"mismatch/kl_k1": 0.5}
    # the call was waited for one forward pass (the update's first micro-batch) after it started
    assert outcome["forwards"][1] == outcome["forwards"][0] + 1, outcome["forwards"]
    for key in ("loss", "grad_norm", "num_valid_tokens", "weight_mean"):
        assert outcome["learner"][key] == pytest.approx(metrics["step1"][key], rel=1e-6), key
    assert outcome["learner"]["nonfinite_proximal_tokens"] == 0
    assert set(outcome["seconds"]) == {"proximal", "correction", "update", "export"}
    v1 = dict(np.load(tmp_path / "v1.npz"))
    for name, value in exports["v1"].items():
        np.testing.assert_allclose(v1[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def _mini_batch_main(rank, world_size, port, model_dir, out_dir):
    """``run_step`` with 2 mini-batches x 2 epochs: losses, norms and the new weights (rank 0)."""
    from system.learner.core import LearnerCore
    from system.learner.group_step import run_step

    torch.set_num_threads(1)
    batch, weights = make_batch(), make_weights(make_batch())
    cfg = _learner_cfg(world_size, "float32", mini_batches=2, updates_per_batch=2)
    core = LearnerCore(cfg, model_dir, rank, world_size, port)
    outcome = run_step(core, batch, rank, world_size, (lambda old: lambda: (weights, {})) if rank == 0 else None)
    if rank == 0:
        np.savez(os.path.join(out_dir, "v1.npz"), **{k: v.float().numpy() for k, v in decode_weights(outcome.payload)})
        with open(os.path.join(out_dir, "learner.json"), "w") as f:
            json.dump(outcome.learner, f)
    core.close()


def test_mini_batches_on_two_ranks_train_what_one_process_trains(model_dir, tmp_path):
    """With ``learner.mini_batches`` = 2 the optimiser steps of 2 ranks are those of one process: global
    mini-batch k is the same 6 of the 12 rows (``shard_rows``: rank 0 holds rows 0-2 and 6-8, rank 1
    rows 3-5 and 9-11), so the 4 updates (2 epochs x 2 mini-batches) agree to float32 summation order.
    With contiguous shards (rows 0-5 | 6-11), 2 ranks trained rows {0-2, 6-8} in the first step and
    one process rows 0-5: other gradients, other weights."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    _spawn(_mini_batch_main, 1, model_dir, str(one))
    _spawn(_mini_batch_main, 2, model_dir, str(two))
    learner = {name: json.loads((path / "learner.json").read_text()) for name, path in (("one", one), ("two", two))}
    for key in ("loss", "grad_norm", "last/loss", "last/grad_norm", "num_valid_tokens"):
        assert learner["two"][key] == pytest.approx(learner["one"][key], rel=1e-5), key
    v1_one, v1_two = dict(np.load(one / "v1.npz")), dict(np.load(two / "v1.npz"))
    for name, value in v1_one.items():
        # bf16 exports of fp32 weights that agree to ~1e-7: equal, or one bf16 ulp apart
        np.testing.assert_allclose(v1_two[name], value, rtol=2**-7, atol=1e-3 * LR, err_msg=name)


def _load_main(rank, world_size, port, model_dir, param_dtype, out_dir, checkpoint_dir):
    """Load ``checkpoint_dir``; each rank writes what the load raised (or "loaded") to its own file."""
    from system.learner.core import LearnerCore

    torch.set_num_threads(1)
    core = LearnerCore(_learner_cfg(world_size, param_dtype), model_dir, rank, world_size, port)
    try:
        core.load_checkpoint(checkpoint_dir)
        outcome = "loaded"
    except ValueError as exc:
        outcome = f"ValueError: {exc}"
    with open(os.path.join(out_dir, f"load_rank{rank}.txt"), "w") as f:
        f.write(outcome)
    core.close()


def _largest_item(ckpt, prefix):
    """(file, offset, length) of the largest stored item whose key starts with ``prefix`` (DCP's metadata)."""
    import pickle

    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        meta = pickle.load(f)
    items = [(info.length, info.relative_path, info.offset) for index, info in meta.storage_data.items()
             if index.fqn.startswith(prefix)]
    length, name, offset = max(items)
    return os.path.join(ckpt, name), offset, length


def test_damaged_checkpoint_bytes_are_found_by_crc_and_non_finite_values_refused_at_load(runs, model_dir, tmp_path):
    """Found by a probe: bytes damaged in place (same size) loaded silently and the run trained from
    them. Every file's CRC-32 is in trainer.json and checked before a resume; a load itself refuses
    NaN / inf parameters or moments, on every rank at once (none is left waiting in a collective)."""
    import shutil

    from system.learner.checkpoint_files import checkpoint_problems

    src = os.path.join(runs(2, "float32")[3], "ckpt", "step_00000001")
    ckpt = str(tmp_path / "step_00000001")
    shutil.copytree(src, ckpt)
    with open(os.path.join(ckpt, "trainer.json")) as f:
        recorded = json.load(f)
    assert set(recorded["crc32"]) == set(recorded["files"]) == set(os.listdir(ckpt)) - {"trainer.json"}
    assert checkpoint_problems(ckpt) == []

    path, offset, length = _largest_item(ckpt, "model.")
    middle = offset + length // 2
    with open(path, "r+b") as f:  # 64 bytes of 0xFF: float32 NaNs in the middle of a weight
        f.seek(middle)
        f.write(b"\xff" * 64)
    problems = checkpoint_problems(ckpt)
    assert len(problems) == 1 and problems[0].startswith(path) and "bytes differ from those written" in problems[0]

    out = tmp_path / "load"
    out.mkdir()
    _spawn(_load_main, 2, model_dir, "float32", str(out), ckpt)
    outcomes = [(out / f"load_rank{r}.txt").read_text() for r in range(2)]
    assert all(o.startswith(f"ValueError: {ckpt}: non-finite values in ") for o in outcomes), outcomes
    assert any("non-finite values in model." in o for o in outcomes), outcomes  # the rank holding it names it
