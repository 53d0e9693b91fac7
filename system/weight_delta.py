"""Lossy delta coding of policy versions, with error feedback (``weight_sync.type=delta``).

The sender keeps ``R``, the float32 weights the receivers hold (their reconstruction), and
for each new version ``W`` sends only a compressed ``D ~ W - R``; sender and receivers both
apply ``R <- R + D``. Because the next delta is taken against ``R`` (not against the previous
``W``), whatever a delta failed to carry is carried by the next ones: the error does not
accumulate (error feedback), it stays about one step's coding error. Every ``full_every``
versions, for the first version a group of receivers sees, and for a version whose delta would
leave ``||W - R|| / ||W||`` above ``full_above_error`` (the codec's own measure of the mismatch it
adds: a change too large or of too high a rank for the factors), the full weights go instead
(``R <- W``).

Codec per tensor (``E = W - R`` in float32):

* 2-D ``[m, n]`` with ``rank * (m + n) < m * n``: one power iteration warm-started from the
  previous ``Q`` (PowerSGD): ``P = orth(E Q)``, ``Q = E^T P``, ``D = P' Q'^T`` where ``P'`` and
  ``Q'`` are the factors as they travel: with ``factors="int8"`` (the default) int8 with one float32
  scale per column, ``s_j = max_i |P_ij| / 127`` (``r (m + n) + 8 r`` bytes instead of ``2 m n`` for
  bf16), with ``factors="float16"`` float16 (``2 r (m + n)`` bytes). The sender applies the same
  ``D`` to ``R`` as the receivers, so the factors' rounding is one more part of what error feedback
  carries to the next version;
* any other floating tensor: int8 with one float32 scale per row (last dimension),
  ``s = max|E_row| / 127``, ``D = round(E / s) * s``;
* a tensor that is not floating point (an integer buffer) goes exactly, as it is, every version
  (float32 would round integers above 2**24, and a quantized delta would be off by some units);
  so does a tensor without elements (``[4, 0]``: there are no rows to quantize, and it costs nothing).

On the wire a delta is a ``WeightPayload`` whose dtypes say ``delta/lowrank`` (float16 factors),
``delta/lowrank-int8`` or ``delta/int8`` per tensor (arrays ``name::p``, ``name::q``, for int8 factors
also ``name::p_scale``, ``name::q_scale``; or ``name::q8``, ``name::scale``), and a full
version is an ordinary payload. Receivers decode into a full bf16 payload for their engine.
"""

import numpy as np
import torch

from system.weight_payload import WeightPayload, decode_weights, encode_weights

LOWRANK, LOWRANK_INT8, INT8 = "delta/lowrank", "delta/lowrank-int8", "delta/int8"
FACTOR_CODES = ("int8", "float16")


def _reference_copy(t: torch.Tensor) -> torch.Tensor:
    """What a reconstruction holds of a tensor: float32 for a floating one, the exact tensor otherwise."""
    return t.to(torch.float32).clone() if t.is_floating_point() else t.clone()


def is_delta(payload: WeightPayload) -> bool:
    return any(d.startswith("delta/") for d in payload.dtypes.values())


def int8_rows(e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q8, scale)``: ``e`` (float32) quantized per row of its last dimension, ``e ~ q8 * scale``."""
    rows = e.reshape(-1, e.shape[-1]) if e.dim() else e.reshape(1, 1)
    scale = rows.abs().amax(dim=1, keepdim=True) / 127.0
    q8 = torch.where(scale > 0, torch.round(rows / torch.where(scale > 0, scale, 1.0)), 0.0).to(torch.int8)
    return q8, scale.to(torch.float32)


def int8_columns(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q8, scale)``: a ``[m, r]`` factor (float32) quantized per column, ``x ~ q8 * scale`` with
    ``scale`` of shape ``[1, r]`` (``int8_rows`` of ``x^T``)."""
    q8t, scale = int8_rows(x.T.contiguous())
    return q8t.T.contiguous(), scale.reshape(1, -1)


def lowrank_step(e: torch.Tensor, q_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One warm-started power iteration: ``P = orth(e q_prev)``, ``Q = e^T P`` (``e ~ P Q^T``), float32."""
    p = torch.linalg.qr(e @ q_prev).Q
    return p, e.T @ p


def code_factors(p: torch.Tensor, q: torch.Tensor, factors: str, name: str,
                 arrays: dict, dtypes: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Put the factors of tensor ``name`` into ``arrays``/``dtypes`` as they travel (``factors``: int8
    per column or float16) and return them as a receiver decodes them (float32)."""
    if factors == "float16":
        p16, q16 = p.to(torch.float16), q.to(torch.float16)
        arrays[f"{name}::p"], arrays[f"{name}::q"] = p16.numpy(), q16.numpy()
        dtypes[f"{name}::p"] = dtypes[f"{name}::q"] = LOWRANK
        return p16.to(torch.float32), q16.to(torch.float32)
    (p8, ps), (q8, qs) = int8_columns(p), int8_columns(q)
    arrays.update({f"{name}::p": p8.numpy(), f"{name}::q": q8.numpy(),
                   f"{name}::p_scale": ps.numpy(), f"{name}::q_scale": qs.numpy()})
    for key in ("p", "q", "p_scale", "q_scale"):
        dtypes[f"{name}::{key}"] = LOWRANK_INT8
    return p8.to(torch.float32) * ps, q8.to(torch.float32) * qs


class DeltaEncoder:
    """The sender's side: ``encode(W)`` returns what to send and advances ``R``."""

    def __init__(self, rank: int = 4, full_every: int = 20, seed: int = 0, full_above_error: float = 0.05,
                 factors: str = "int8") -> None:
        if rank < 1 or full_every < 1:
            raise ValueError(f"rank and full_every must be >= 1, got {rank}, {full_every}")
        if factors not in FACTOR_CODES:
            raise ValueError(f"factors must be one of {FACTOR_CODES}, got {factors!r}")
        self.factors = factors
        if not full_above_error > 0:
            raise ValueError(f"full_above_error must be > 0, got {full_above_error}")
        self.rank, self.full_every, self.seed = rank, full_every, seed
        self.full_above_error = full_above_error
        self.full_for_error = False
        """Whether the last ``encode`` sent the full weights because its delta would have left the
        reconstruction more than ``full_above_error`` from them (``||W - R|| / ||W||``)."""
        self.reference: dict[str, torch.Tensor] | None = None
        self._q: dict[str, torch.Tensor] = {}
        self._since_full = 0
        self.rel_error = 0.0
        """``||W - R|| / ||W||`` (Frobenius, over every tensor) after the last ``encode``: how far the
        receivers' reconstruction ``R`` is from the weights it stands for (0 after a full version)."""

    def reset(self) -> None:
        """The next version goes in full (a new group of receivers)."""
        self.reference = None

    def encode(self, payload: WeightPayload) -> WeightPayload:
        """What to send for ``payload`` (version W): the full weights for the first version, every
        ``full_every``-th, and whenever the delta would leave ``||W - R|| / ||W||`` above
        ``full_above_error`` (the codec cannot keep up: a large or full-rank change); else the delta."""
        state = dict(decode_weights(payload))
        self.full_for_error = False
        if self.reference is None or self._since_full + 1 >= self.full_every:
            return self._full(payload, state)
        self._since_full += 1
        arrays, dtypes = {}, {}
        residual_sq, weight_sq = 0.0, 0.0
        for name, w in state.items():
            if not w.is_floating_point() or w.numel() == 0:  # exactly, as the full payload carries it
                arrays[name], dtypes[name] = payload.arrays[name], payload.dtypes[name]
                self.reference[name] = w.clone()
                continue
            w32 = w.to(torch.float32)
            e = w32 - self.reference[name]
            if e.dim() == 2 and self.rank * sum(e.shape) < e.numel():
                q_prev = self._q.get(name)
                # none yet, or a column of zeros (a version without change left Q = E^T P = 0, whose
                # next E Q would be 0: QR then returns coordinate axes, and the delta fits E's first rows)
                if q_prev is None or not bool((q_prev.norm(dim=0) > 0).all()):
                    gen = torch.Generator().manual_seed(self.seed)
                    q_prev = torch.randn(e.shape[1], self.rank, generator=gen)
                p, q = code_factors(*lowrank_step(e, q_prev), self.factors, name, arrays, dtypes)
                self._q[name] = q
                d = p @ q.T
            else:
                q8, scale = int8_rows(e)
                d = (q8.to(torch.float32) * scale).reshape(e.shape)
                arrays[f"{name}::q8"], arrays[f"{name}::scale"] = q8.numpy(), scale.numpy()
                dtypes[f"{name}::q8"] = dtypes[f"{name}::scale"] = INT8
            self.reference[name] += d
            # the norms accumulate in float64 (no float64 copy of the tensors: this pass was half the encode)
            residual_sq += float(torch.linalg.vector_norm(e.sub_(d), dtype=torch.float64)) ** 2
            weight_sq += float(torch.linalg.vector_norm(w32, dtype=torch.float64)) ** 2
        self.rel_error = (residual_sq / weight_sq) ** 0.5 if weight_sq > 0 else 0.0
        if self.rel_error > self.full_above_error:
            self.full_for_error = True
            return self._full(payload, state)
        return WeightPayload(policy_version=payload.policy_version, arrays=arrays, dtypes=dtypes)

    def _full(self, payload: WeightPayload, state: dict[str, torch.Tensor]) -> WeightPayload:
        """Send ``payload`` as it is: the reconstruction becomes the weights themselves."""
        self.reference = {k: _reference_copy(v) for k, v in state.items()}
        self._since_full, self.rel_error = 0, 0.0
        return payload


class DeltaDecoder:
    """A receiver's side: ``decode(wire)`` returns the full bf16 payload for the engine."""

    def __init__(self) -> None:
        self.reference: dict[str, torch.Tensor] | None = None
        self._dtypes: dict[str, str] = {}

    def decode(self, wire: WeightPayload) -> WeightPayload:
        if not is_delta(wire):
            self.reference = {k: _reference_copy(v) for k, v in decode_weights(wire)}
            self._dtypes = dict(wire.dtypes)
            return wire
        if self.reference is None:
            raise ValueError(f"a delta for policy version {wire.policy_version} reached a receiver without "
                             "the full weights it applies to")
        for name in self.reference:
            if name in wire.arrays:  # a tensor that goes exactly (not floating point)
                exact = WeightPayload(wire.policy_version, {name: wire.arrays[name]}, {name: wire.dtypes[name]})
                self.reference[name] = dict(decode_weights(exact))[name].clone()
            elif f"{name}::p" in wire.arrays:
                p, q = (torch.from_numpy(np.asarray(wire.arrays[f"{name}::{k}"])).to(torch.float32) for k in "pq")
                if wire.dtypes[f"{name}::p"] == LOWRANK_INT8:
                    p = p * torch.from_numpy(np.asarray(wire.arrays[f"{name}::p_scale"]))
                    q = q * torch.from_numpy(np.asarray(wire.arrays[f"{name}::q_scale"]))
                self.reference[name] += p @ q.T
            else:
                q8 = torch.from_numpy(np.asarray(wire.arrays[f"{name}::q8"])).to(torch.float32)
                scale = torch.from_numpy(np.asarray(wire.arrays[f"{name}::scale"]))
                self.reference[name] += (q8 * scale).reshape(self.reference[name].shape)
        # a copy even where the dtype is the reference's own: the next delta updates the reference in place
        state = {k: v.to(getattr(torch, self._dtypes[k]), copy=True) for k, v in self.reference.items()}
        return encode_weights(state, wire.policy_version)
