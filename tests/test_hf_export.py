"""``system.learner.hf_export.load_policy``: a DCP checkpoint's parameters into the run's architecture.
The end-to-end export of a trained run (``aisrl export``) is checked in ``tests/test_e2e_train.py``."""

import pytest
import torch
import torch.distributed.checkpoint as dcp
from transformers import Qwen2Config, Qwen2ForCausalLM

from system.learner.hf_export import ExportError, load_policy


def tiny(tied: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied))


def save(tmp_path, model, drop=(), change=None):
    """The model dir (config only matters) and a DCP checkpoint of its parameters + 1, as the learner
    saves them (``{"model": state}``), without ``drop`` and with ``change`` applied to the state."""
    model.save_pretrained(tmp_path / "model")
    state = {k: v + 1.0 for k, v in model.state_dict().items() if k not in drop}
    if change:
        change(state)
    dcp.save({"model": state}, checkpoint_id=str(tmp_path / "learner"), no_dist=True)
    return str(tmp_path / "model"), str(tmp_path / "learner"), state


def test_every_parameter_comes_from_the_checkpoint(tmp_path):
    model_dir, learner, state = save(tmp_path, tiny(tied=False))
    loaded = load_policy(model_dir, learner).state_dict()
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)


def test_a_tied_head_missing_from_the_checkpoint_follows_the_embeddings(tmp_path):
    model_dir, learner, state = save(tmp_path, tiny(tied=True), drop=("lm_head.weight",))
    policy = load_policy(model_dir, learner)
    assert torch.equal(policy.lm_head.weight, state["model.embed_tokens.weight"])


def test_an_untied_parameter_missing_or_of_another_shape_or_not_finite_is_refused_by_name(tmp_path):
    model_dir, learner, _ = save(tmp_path / "a", tiny(tied=False), drop=("lm_head.weight",))
    with pytest.raises(ExportError, match="the checkpoint has no lm_head.weight"):
        load_policy(model_dir, learner)

    def wider(state):
        state["model.norm.weight"] = torch.ones(17)

    model_dir, learner, _ = save(tmp_path / "b", tiny(tied=False), change=wider)
    with pytest.raises(ExportError, match=r"parameter model.norm.weight has shape \(17,\) in the checkpoint, \(16,\)"):
        load_policy(model_dir, learner)

    def nan(state):
        state["model.norm.weight"][3] = float("nan")

    model_dir, learner, _ = save(tmp_path / "c", tiny(tied=False), change=nan)
    with pytest.raises(ExportError, match="parameter model.norm.weight holds non-finite values"):
        load_policy(model_dir, learner)


def test_an_out_that_is_holds_or_lies_in_the_run_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """Found by a review: ``aisrl export RUN --out RUN --overwrite`` replaced the run directory with the
    exported model (checkpoints, metrics and config gone). ``--out`` must lie outside the run; ``/`` has
    no name to put a new directory beside."""
    from system.learner.hf_export import check_out_path

    run = tmp_path / "runs" / "r1"
    (run / "checkpoints").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "runs")
    for out, why in ((run, "is the run"), (tmp_path / "runs" / "r1" / "." , "is the run"),
                     (run / "checkpoints", "is inside the run"), (run / "hf", "is inside the run"),
                     (tmp_path / "runs", "holds the run"), (tmp_path, "holds the run")):
        with pytest.raises(ExportError, match=why):
            check_out_path(run, out)
    with pytest.raises(ExportError, match="holds the run"):  # "." here is the runs' folder
        check_out_path(run, tmp_path / "runs" / ".")
    with pytest.raises(ExportError, match="not a directory that can be replaced"):
        check_out_path(run, tmp_path / "/")
    check_out_path(run, tmp_path / "hf")  # beside the runs: fine
    check_out_path(run, tmp_path / "runs" / "r1-hf")  # a sibling whose name starts like the run's: fine
