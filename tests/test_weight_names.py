"""Every weight payload names the model's tensors (``system.rollout.weight_names``), checked at each load."""

from system.rollout.weight_names import model_tensor_names, payload_name_problems


def test_names_are_those_of_the_learners_model_class(tmp_path):
    from test_learner_step import save_tiny_model
    from transformers import Qwen2ForCausalLM

    model_dir = save_tiny_model(tmp_path / "m")
    assert model_tensor_names(model_dir) == frozenset(Qwen2ForCausalLM.from_pretrained(model_dir).state_dict())
    assert model_tensor_names(tmp_path / "absent") == frozenset()  # said with a warning, check skipped


def test_a_renamed_or_missing_weight_is_named_and_buffers_and_the_tied_head_pass():
    ckpt = frozenset({"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight",
                      "model.layers.0.self_attn.rotary_emb.inv_freq"})
    exact = {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight"}
    # the rotary buffer is on one side only; the tied head is the payload's only: both fine
    assert payload_name_problems(ckpt, exact | {"lm_head.weight"}, tied_embeddings=True) is None
    # untied, the head must be there on both sides
    assert "lm_head.weight" in payload_name_problems(ckpt, exact | {"lm_head.weight"}, tied_embeddings=False)
    renamed = {f"_orig_mod.{n}" for n in exact}  # a compiled module's prefix on the learner side
    problem = payload_name_problems(ckpt, renamed, tied_embeddings=True)
    assert problem.startswith("3 of the model's tensors missing (e.g. model.embed_tokens.weight")
    assert "3 the model does not have (e.g. _orig_mod.model.embed_tokens.weight" in problem
    assert payload_name_problems(frozenset(), renamed, tied_embeddings=True) is None  # names unknown: skipped
