"""Every weight payload names the model's tensors (``system.rollout.weight_names``), checked at each load."""

import json
import struct

from system.rollout.weight_names import checkpoint_tensor_names, payload_name_problems


def write_safetensors_header(path, names):
    header = {n: {"dtype": "BF16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]} for i, n in enumerate(names)}
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * (2 * len(names)))


def test_names_come_from_every_shard_header(tmp_path):
    write_safetensors_header(tmp_path / "model-00001-of-00002.safetensors", ["a.weight", "b.bias"])
    write_safetensors_header(tmp_path / "model-00002-of-00002.safetensors", ["c.weight"])
    assert checkpoint_tensor_names(tmp_path) == {"a.weight", "b.bias", "c.weight"}
    assert checkpoint_tensor_names(tmp_path / "absent") == frozenset()


def test_a_renamed_or_missing_weight_is_named_and_buffers_and_the_tied_head_pass():
    ckpt = frozenset({"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight",
                      "model.layers.0.self_attn.rotary_emb.inv_freq"})
    exact = {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight"}
    # the rotary buffer is the checkpoint's only; the tied head is the payload's only: both fine
    assert payload_name_problems(ckpt, exact | {"lm_head.weight"}, tied_embeddings=True) is None
    # untied, the head must be there on both sides
    assert "lm_head.weight" in payload_name_problems(ckpt, exact | {"lm_head.weight"}, tied_embeddings=False)
    renamed = {f"_orig_mod.{n}" for n in exact}  # a compiled module's prefix on the learner side
    problem = payload_name_problems(ckpt, renamed, tied_embeddings=True)
    assert problem.startswith("3 of the model's tensors missing (e.g. model.embed_tokens.weight")
    assert "3 the model does not have (e.g. _orig_mod.model.embed_tokens.weight" in problem
    assert payload_name_problems(frozenset(), renamed, tied_embeddings=True) is None  # no safetensors: skipped
