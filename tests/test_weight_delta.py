"""Delta coding of policy versions (``system.weight_delta``): the codec by hand, receivers that
reproduce the sender's reconstruction exactly, and error feedback that keeps the error from
accumulating (against a second, feedback-free implementation)."""

import pytest
import torch

from system.weight_delta import (
    DeltaDecoder,
    DeltaEncoder,
    code_factors,
    int8_rows,
    is_delta,
    lowrank_step,
)
from system.weight_payload import decode_weights, encode_weights


def test_int8_rows_by_hand():
    # row 0: max |e| = 1.27 -> scale 0.01, q = [127, -50]; row 1 all zero -> scale 0, q 0
    q8, scale = int8_rows(torch.tensor([[1.27, -0.5], [0.0, 0.0]]))
    assert q8.tolist() == [[127, -50], [0, 0]] and scale.flatten().tolist() == pytest.approx([0.01, 0.0])


def test_one_power_iteration_recovers_a_rank_one_change():
    # E = u v^T: P = orth(E Q) spans u, Q = E^T P, so P Q^T = P P^T E = E (float32 rounding; as the
    # factors travel: int8 per column ~1/254 of a column's largest entry, float16 ~1e-3 relative)
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(64, 1, generator=g), torch.randn(48, 1, generator=g)
    e = u @ v.T
    p, q = lowrank_step(e, torch.randn(48, 4, generator=g))
    assert p.dtype == torch.float32 and (p @ q.T - e).norm() / e.norm() < 1e-5
    for factors, bound in (("int8", 1e-2), ("float16", 2e-3)):
        pd, qd = code_factors(p, q, factors, "m", {}, {})
        assert (pd @ qd.T - e).norm() / e.norm() < bound, factors


def test_int8_factors_by_hand():
    # P [3, 2]: column 0 max |.| 1.27 -> scale 0.01, codes [127, -50, 0]; column 1 all zero -> scale 0
    # Q [2, 2]: column 0 max 2.54 -> scale 0.02, [127, 25] (0.5 / 0.02 = 25); column 1 max 0.127 -> 0.001
    p = torch.tensor([[1.27, 0.0], [-0.5, 0.0], [0.0, 0.0]])
    q = torch.tensor([[2.54, 0.127], [0.5, -0.05]])
    arrays, dtypes = {}, {}
    pd, qd = code_factors(p, q, "int8", "w", arrays, dtypes)
    assert arrays["w::p"].tolist() == [[127, 0], [-50, 0], [0, 0]] and arrays["w::p"].dtype == "int8"
    assert arrays["w::p_scale"].flatten().tolist() == pytest.approx([0.01, 0.0])
    assert arrays["w::q"].tolist() == [[127, 127], [25, -50]]
    assert arrays["w::q_scale"].flatten().tolist() == pytest.approx([0.02, 0.001])
    assert set(dtypes.values()) == {"delta/lowrank-int8"}
    assert torch.allclose(pd, p, atol=1e-6) and torch.allclose(qd, q, atol=1e-6)  # every code exact here
    with pytest.raises(ValueError, match="factors must be one of"):
        DeltaEncoder(factors="int4")


def walk(steps: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """bf16 weights after ``steps`` Adam-like updates: full-rank noise of relative size ~1e-3."""
    g = torch.Generator().manual_seed(seed)
    w = {"layer.weight": torch.randn(96, 128, generator=g), "layer.bias": torch.randn(96, generator=g)}
    out = []
    for _ in range(steps):
        w = {k: v + 1e-3 * torch.randn(v.shape, generator=g) for k, v in w.items()}
        out.append({k: v.to(torch.bfloat16) for k, v in w.items()})
    return out


@pytest.mark.parametrize("factors", ["int8", "float16"])
def test_receivers_hold_the_senders_reconstruction_and_deltas_are_small(factors):
    versions = walk(12)
    enc, dec = DeltaEncoder(rank=4, full_every=10, factors=factors), DeltaDecoder()
    full_bytes = encode_weights(versions[0], 1).num_bytes
    for v, state in enumerate(versions, start=1):
        before = {k: r.clone() for k, r in enc.reference.items()} if v > 1 else None
        wire = enc.encode(encode_weights(state, v))
        got = dict(decode_weights(dec.decode(wire)))
        assert is_delta(wire) == (v not in (1, 11))  # full at the first version, then every 10th
        want = {k: r.to(torch.bfloat16) for k, r in enc.reference.items()}
        assert all(torch.equal(got[k], want[k]) for k in want)
        if not is_delta(wire):  # a full version is the weights themselves
            assert all(torch.equal(got[k], state[k]) for k in state)
        else:  # the bias (1-D: int8, one scale) against the true weights: E = W - R_before is coded with
            # scale max|E| / 127, so the new reference R (what the receivers hold, before its bf16 cast,
            # compared above) is off by at most half a step, max|E| / 254, plus float32 rounding
            w = state["layer.bias"].float()
            e = w - before["layer.bias"]
            off = (enc.reference["layer.bias"] - w).abs()
            assert (off <= e.abs().max() / 254 * (1 + 1e-5) + w.abs() * 2**-23).all(), v
            assert off.max() < 0.1 * e.abs().max(), v  # far below what was missing: the bias moved
        if is_delta(wire):  # P [96, 4] and Q [128, 4]: int8 + 4 float32 scales each, or float16;
            # the int8 bias [96] + one float32 scale
            factor_bytes = 4 * (96 + 128) + 2 * 4 * 4 if factors == "int8" else 2 * 4 * (96 + 128)
            assert wire.num_bytes == factor_bytes + 96 + 4 == {"int8": 1028, "float16": 1892}[factors]
            assert full_bytes == 2 * 96 * (128 + 1) and wire.num_bytes <= full_bytes / 8


@pytest.mark.parametrize("factors", ["int8", "float16"])
def test_error_feedback_delivers_what_one_delta_could_not(factors):
    """One full-rank jump of a [96, 128] matrix, then no change. Rank-4 deltas carry 4 directions
    each; with error feedback every delta codes what is still missing, so after ~96 / 4 = 24
    versions the receivers hold the jump (to the factors' rounding). Without feedback (each
    version's own change coded alone) only the first delta carries anything: the rest of the jump
    (all but its top 4 of 96 directions, most of its norm) is never delivered."""
    g = torch.Generator().manual_seed(0)
    before, jump = torch.randn(96, 128, generator=g), 0.1 * torch.randn(96, 128, generator=g)
    after = {"m": (before + jump).to(torch.bfloat16)}
    enc = DeltaEncoder(rank=4, full_every=1000, full_above_error=10.0, factors=factors)  # never full for its error
    enc.encode(encode_weights({"m": before.to(torch.bfloat16)}, 1))
    assert enc.rel_error == 0.0  # a full version: the receivers hold the weights
    errors = []
    for v in range(2, 40):
        enc.encode(encode_weights(after, v))
        errors.append(float((enc.reference["m"] - after["m"].float()).norm() / jump.norm()))
        # the streamed codec error, ||W - R|| / ||W||, from the reconstruction the receivers hold
        want = float((after["m"].float() - enc.reference["m"]).norm() / after["m"].float().norm())
        assert enc.rel_error == pytest.approx(want, rel=1e-5, abs=1e-9)
    assert errors[-1] < 0.01 and errors[0] > 0.7, (errors[0], errors[-1])
    # without feedback: the first delta is the same rank-4 code of the jump; later changes are 0
    p, q = lowrank_step(after["m"].float() - before.to(torch.bfloat16).float(),
                        torch.randn(128, 4, generator=torch.Generator().manual_seed(0)))
    plain = (before.to(torch.bfloat16).float() + p.float() @ q.float().T - after["m"].float()).norm() / jump.norm()
    assert plain > 0.7


def test_a_delta_without_the_full_weights_is_refused():
    enc = DeltaEncoder(rank=2)
    versions = walk(2)
    enc.encode(encode_weights(versions[0], 1))
    with pytest.raises(ValueError, match="policy version 2 reached a receiver without the full weights"):
        DeltaDecoder().decode(enc.encode(encode_weights(versions[1], 2)))


def test_a_version_without_change_does_not_spoil_the_next_low_rank_delta():
    """Found by a review: a version with the same weights (a skipped non-finite step still advances the
    version) left the warm start Q = E^T P = 0; the next delta's E Q was then 0 and its basis the
    coordinate axes, so it carried only E's first rows (relative residual 0.98). A rank-4 change after
    such a version is carried to float16 rounding, as from the random start."""
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(48, 40, generator=gen)
    change = torch.randn(48, 4, generator=gen) @ torch.randn(4, 40, generator=gen) * 0.01
    enc = DeltaEncoder(rank=4, full_every=100)
    for w in (w0, w0):  # the full version, then one without change
        enc.encode(encode_weights({"w": w}, policy_version=1))
    enc.encode(encode_weights({"w": w0 + change}, policy_version=2))
    residual = (w0 + change - enc.reference["w"]).norm() / change.norm()
    assert residual < 0.01, float(residual)


def test_integer_tensors_go_exactly_in_every_delta_version():
    """Found by a probe: an int64 buffer went through the float32 / int8 delta path and came back off
    by 3-4 units from the second version on (float32 holds integers exactly only up to 2**24)."""
    enc, dec = DeltaEncoder(rank=2, full_every=100), DeltaDecoder()
    w = torch.randn(8, 16)
    for version in range(5):
        counts = torch.tensor([120_000_001 + 7 * version, -3, 2**40 + version], dtype=torch.int64)
        state = {"w": (w + 0.01 * version).to(torch.bfloat16), "counts": counts}
        wire = enc.encode(encode_weights(state, version))
        assert is_delta(wire) == (version > 0)
        got = dict(decode_weights(dec.decode(wire)))
        assert got["counts"].dtype == torch.int64 and torch.equal(got["counts"], counts), version
        assert got["w"].dtype == torch.bfloat16


@pytest.mark.parametrize("shape", [(0,), (4, 0), (0, 4), (2, 0, 3)])
def test_a_tensor_without_elements_goes_through_every_delta_version(shape):
    """Found by a review: a ``[4, 0]`` or ``[0]`` float tensor (the export path allows them) made the
    second version's int8 coding raise ("cannot reshape tensor of 0 elements"), which stopped the run.
    It now goes as it is; the other tensor still goes as a delta."""
    enc, dec = DeltaEncoder(rank=2, full_every=100), DeltaDecoder()
    w = torch.randn(8, 16)
    for version in range(3):
        state = {"w": (w + 0.01 * version).to(torch.bfloat16), "empty": torch.zeros(shape, dtype=torch.bfloat16)}
        wire = enc.encode(encode_weights(state, version))
        assert is_delta(wire) == (version > 0)
        got = dict(decode_weights(dec.decode(wire)))
        assert got["empty"].shape == shape and got["empty"].dtype == torch.bfloat16
        assert torch.equal(got["w"], enc.reference["w"].to(torch.bfloat16))  # the sender's reconstruction
        if version == 0:  # the full version: the weights themselves
            assert torch.equal(got["w"], state["w"])


def test_a_delta_that_would_leave_the_reconstruction_too_far_goes_in_full():
    """A full-rank jump of a [96, 128] matrix: a rank-4 delta carries 4 of its 96 directions, leaving
    ||W - R|| / ||W|| ~ 0.5 sqrt(92/96) / sqrt(1 + 0.25) ~ 0.44 (the jump is 0.5 of the weights' scale).
    Above ``full_above_error`` = 0.05 the version goes in full instead (the receivers then hold the
    weights exactly, ``full_for_error`` set, the error 0); a small rank-1 change after it goes as a
    delta again. With the threshold at 0.9 the same jump goes as a delta, its error ~0.44."""
    g = torch.Generator().manual_seed(1)
    before = torch.randn(96, 128, generator=g)
    jump = before + 0.5 * torch.randn(96, 128, generator=g)
    nudge = jump + 1e-3 * torch.outer(torch.randn(96, generator=g), torch.randn(128, generator=g))
    versions = [{"m": x.to(torch.bfloat16)} for x in (before, jump, nudge)]
    enc, dec = DeltaEncoder(rank=4, full_every=100, full_above_error=0.05), DeltaDecoder()
    sent = []
    for v, state in enumerate(versions, start=1):
        wire = enc.encode(encode_weights(state, v))
        got = dict(decode_weights(dec.decode(wire)))
        sent.append((is_delta(wire), enc.full_for_error))
        if v == 2:
            assert torch.equal(got["m"], state["m"]) and enc.rel_error == 0.0
    assert sent == [(False, False), (False, True), (True, False)]
    assert torch.equal(got["m"], enc.reference["m"].to(torch.bfloat16))  # receivers hold the reconstruction
    loose = DeltaEncoder(rank=4, full_every=100, full_above_error=0.9)
    loose.encode(encode_weights(versions[0], 1))
    assert is_delta(loose.encode(encode_weights(versions[1], 2))) and not loose.full_for_error
    assert 0.35 < loose.rel_error < 0.5, loose.rel_error
    with pytest.raises(ValueError, match="full_above_error"):
        DeltaEncoder(full_above_error=0.0)
