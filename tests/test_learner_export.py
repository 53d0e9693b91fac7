"""Weight export of an unsharded model (no process group): HF names, bf16, ``lm_head.weight`` always.

The sharded 2-rank export runs in ``test_learner_fsdp``.
"""

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from system.learner.export import _with_head, export_weights
from system.weight_payload import decode_weights


def _model(tie):
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)
    return Qwen2ForCausalLM(cfg)


@pytest.mark.parametrize("tie", [False, True])
def test_export_is_bf16_state_dict_with_head(tie):
    model = _model(tie)
    payload = export_weights(model, policy_version=7)
    exported = dict(decode_weights(payload))
    expected = model.state_dict()
    assert payload.policy_version == 7 and set(exported) == set(expected) and "lm_head.weight" in exported
    for name, weight in expected.items():
        assert exported[name].dtype == torch.bfloat16
        torch.testing.assert_close(exported[name], weight.to(torch.bfloat16), rtol=0, atol=0, msg=name)
    if tie:
        torch.testing.assert_close(exported["lm_head.weight"], exported["model.embed_tokens.weight"])


def _arena():
    """An ``into`` for ``export_weights`` over one flat buffer laid out as the broadcast lays out a
    payload (``weight_layout.offsets``). Returns ``(into, {"buffer": ...}, the sizes asked for)``."""
    from system.weight_layout import offsets

    asked, held = {}, {}

    def into(sizes):
        asked.update(sizes)
        starts, nbytes = offsets(sizes)
        held["buffer"] = np.full(nbytes, 0xAB, dtype=np.uint8)  # not zeros: a skipped copy would show
        return {n: held["buffer"][starts[n]:starts[n] + sizes[n]] for n in sizes}

    return into, held, asked


@pytest.mark.parametrize("tie", [False, True])
def test_an_export_into_given_memory_has_the_same_bits_and_lives_there(tie):
    model = _model(tie)
    plain = export_weights(model, policy_version=3)
    into, held, asked = _arena()
    placed = export_weights(model, policy_version=3, into=into)
    # asked for exactly the arrays the payload holds, with their sizes (bf16: 2 bytes an element)
    assert asked == {n: a.nbytes for n, a in plain.arrays.items()}
    assert "lm_head.weight" in asked and asked["lm_head.weight"] == 32 * 32 * 2
    for name, arr in plain.arrays.items():
        assert np.array_equal(placed.arrays[name], arr), name
        assert np.shares_memory(placed.arrays[name], held["buffer"]), name  # no copy of its own
    if tie:  # the head has its own place, holding the embedding's bits
        head, embed = placed.arrays["lm_head.weight"], placed.arrays["model.embed_tokens.weight"]
        assert not np.shares_memory(head, embed) and np.array_equal(head, embed)


def test_an_export_whose_arrays_differ_from_what_it_announced_owns_its_memory():
    # the export announced a and b (their places laid out for those two), but holds a and c: no array
    # may stay at an offset the broadcast would not expect, so the one assembled in place is copied out
    from system.learner.export import _placed

    flat = torch.zeros(128, dtype=torch.uint8)
    dests = {"a": flat[0:8], "b": flat[64:72]}
    a = dests["a"].view(torch.bfloat16)  # assembled in place by the gather
    a.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16))
    c = torch.tensor([5, 6], dtype=torch.int32)
    out = _placed({"a": a, "c": c}, dests, {"a": 8, "b": 8})
    assert out["a"].tolist() == [1.0, 2.0, 3.0, 4.0] and out["c"] is c
    assert not (flat.data_ptr() <= out["a"].data_ptr() < flat.data_ptr() + 128)
    # announced right: every array in its place (c copied there), the bits unchanged
    dests["c"] = flat[64:72]
    out = _placed({"a": a, "c": c}, {"a": dests["a"], "c": dests["c"]}, {"a": 8, "c": 8})
    assert out["a"].data_ptr() == flat.data_ptr() and out["c"].data_ptr() == flat.data_ptr() + 64
    assert out["c"].tolist() == [5, 6] and flat[64:72].view(torch.int32).tolist() == [5, 6]


def test_an_export_given_no_memory_is_the_plain_one():
    model = _model(True)
    plain = export_weights(model, policy_version=1)
    none = export_weights(model, policy_version=1, into=lambda sizes: None)
    assert all(np.array_equal(none.arrays[n], a) for n, a in plain.arrays.items()) and none.arrays.keys() == plain.arrays.keys()


def test_tied_head_is_filled_in_when_the_state_omits_it():
    model = _model(tie=True)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert _with_head(state, model)["lm_head.weight"] is state["model.embed_tokens.weight"]
    untied = _model(tie=False)
    with pytest.raises(ValueError, match="lm_head.weight"):
        _with_head({k: v for k, v in untied.state_dict().items() if k != "lm_head.weight"}, untied)


def _sharded_export_main(rank, world_size, port, out_path):
    """One rank: a module whose dim-0 sizes split unevenly over 3 ranks (5 -> 2/2/1, 1 -> 1/0/0,
    2 -> 1/1/0, 7 -> 3/3/1), a tied and an empty parameter, a float and an integer buffer, sharded
    by FSDP2; rank 0 writes
    the one-collective gather and DCP's per-parameter full state dict, both cast to bf16."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from system.learner import distributed
    from system.learner.export import full_state_dict, gather_state_bf16

    distributed.init_process_group(rank, world_size, port)
    torch.manual_seed(0)  # the same initial values on every rank, as a loaded checkpoint would give
    module = nn.Module()
    module.a = nn.Parameter(torch.randn(5, 3))
    module.b = nn.Parameter(torch.randn(1, 4))
    module.c = nn.Parameter(torch.randn(2))
    module.d = nn.Parameter(torch.randn(7, 2, 2) * 1e3)
    module.tied = module.a  # one parameter under two names (tied embeddings): gathered once, listed twice
    module.z = nn.Parameter(torch.zeros(4, 0))  # no elements: 0 local rows on every rank
    module.register_buffer("scale", torch.tensor([0.1, 3.0]))
    module.register_buffer("steps", torch.arange(4))
    fully_shard(module, mesh=init_device_mesh("cpu", (world_size,)))
    from system.learner.export import first_names

    kept = module.state_dict(keep_vars=True)  # as export_weights passes it: tied names are one object
    assert {n: f for n, f in first_names(kept).items() if n != f} == {"tied": "a"}  # gathered once
    packed = gather_state_bf16(kept)
    bucketed = gather_state_bf16(module.state_dict(keep_vars=True), bucket_bytes=40)  # four gathers: [a], [b, c], [d], [z] (see below)
    reference = full_state_dict(module)
    # rank 0 assembles each gathered tensor in the memory given for it (by name, flat bytes)
    flat = torch.zeros(64 * 8, dtype=torch.uint8)
    dests = {"a": flat[0:30], "d": flat[64:64 + 56]} if rank == 0 else {}  # 5x3 and 7x2x2 bf16
    into = gather_state_bf16(module.state_dict(keep_vars=True), into=dests)
    if rank == 0:
        for name, dest in dests.items():
            assert into[name].data_ptr() == dest.data_ptr(), name  # assembled there
        torch.save({"packed": packed, "bucketed": bucketed, "into": into, "reference": reference}, out_path)
    else:
        assert packed is None and bucketed is None
    distributed.destroy_process_group(barrier=True)


def test_one_collective_gather_equals_the_per_parameter_full_state_dict(tmp_path):
    import torch.multiprocessing as mp

    from system.learner.distributed import find_free_port

    out, port, ctx = tmp_path / "state.pt", find_free_port(), mp.get_context("spawn")
    procs = [ctx.Process(target=_sharded_export_main, args=(r, 3, port, str(out))) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    saved = torch.load(out)
    reference = saved["reference"]
    for packed in (saved["packed"], saved["bucketed"], saved["into"]):
        assert list(packed) == list(reference), (list(packed), list(reference))
        assert set(packed) == {"a", "b", "c", "d", "tied", "z", "scale", "steps"}
        for name, full in reference.items():
            expected = full.to(torch.bfloat16) if full.is_floating_point() else full
            assert packed[name].dtype == expected.dtype and packed[name].shape == expected.shape, name
            assert torch.equal(packed[name], expected), name  # the same bits: one cast, then a gather
    assert saved["packed"]["steps"].tolist() == [0, 1, 2, 3] and saved["packed"]["z"].shape == (4, 0)


def test_buckets_hold_consecutive_tensors_within_the_limit():
    from system.learner.export import _buckets

    bf16 = torch.bfloat16
    # gathered bytes over 3 ranks (W x padded rows x row elements x 2 bytes):
    # a (5, 3): 3*2*3*2 = 36; b (1, 4): 3*1*4*2 = 24; c (2,): 3*1*1*2 = 6; d (7, 2, 2): 3*3*4*2 = 72
    layout = [("a", (5, 3), bf16, 2), ("b", (1, 4), bf16, 1), ("c", (2,), bf16, 1), ("d", (7, 2, 2), bf16, 3)]
    assert _buckets(layout, 3, 40) == [[0], [1, 2], [3]]  # d alone exceeds the limit: its own bucket
    assert _buckets(layout, 3, 1 << 20) == [[0, 1, 2, 3]]
    assert _buckets(layout, 3, 66) == [[0, 1, 2], [3]]  # 36 + 24 + 6 = 66 fits exactly
    assert _buckets([], 3, 40) == []
