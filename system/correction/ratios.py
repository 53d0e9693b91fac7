"""Log-ratios between the learner and the behaviour policy, derived once per batch (spec section 0).

    valid = mask != 0 and mu, old finite        d = old - mu (0 where not valid)
    dc = clamp(d, -20, 20)                      rho = exp(dc) (0 where not valid)
    T_i = sum_t valid                           L_i = sum_t dc        rho_seq_i = exp(clamp(L_i, -20, 20))

Non-finite log-probs are replaced by 0 *before* any arithmetic, so no NaN can leak into a
statistic, a weight or a gradient. (A float64 difference that overflows, possible only for
float64 inputs beyond +-1e308, counts as non-finite too.) Statistics are float64; weights
built from them are handed back in ``weight_dtype``.

One pass over (mu, old, mask) gives the valid mask and, per response, the sums of every
per-token term of the diagnostics (``row_sums``): on CPU a fused numba kernel
(``row_sums_kernel``), elsewhere torch. The float64 [B, T] tensors (``d_BT``, ``rho_BT``, ...)
are derived on first access only, from the inputs, which are referenced, not copied: do not
modify them in place while the ``LogRatios`` is in use.

Shapes: B = responses in the batch, T = padded response length, K = ``len(row_sums.COLUMNS)``.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from system.correction.row_sums import (
    COLUMNS,
    LOG_RATIO_CLAMP,
    row_fields,
    row_sums_torch,
    valid_masks_BT,
)
from system.correction.row_sums_kernel import row_sums_kernel

__all__ = ["LOG_RATIO_CLAMP", "LogRatios", "compute_log_ratios", "select_sequences"]


@dataclass(frozen=True)
class LogRatios:
    """Everything the diagnostics and the weights derive from ``(mu, old, mask)``; all detached."""

    valid_BT: torch.Tensor
    """bool: mask != 0 and both log-probs finite."""
    num_valid_B: torch.Tensor
    """int64: T_i, valid tokens of each response."""
    seq_valid_B: torch.Tensor
    """bool: T_i >= 1 (the response counts as a sequence)."""
    seq_logratio_B: torch.Tensor
    """float64: L_i = sum of dc over valid tokens, 0 for an empty response; not clamped."""
    rho_seq_B: torch.Tensor
    """float64: exp(clamp(L_i, -20, 20)); 1 for an empty response (no token carries it)."""
    nonfinite_tokens: int
    """Masked-in tokens excluded because mu or old was NaN or +-inf."""
    nonfinite_B: torch.Tensor
    """int64: the non-finite masked-in tokens of each response."""
    weight_dtype: torch.dtype
    """Floating dtype of the inputs promoted to at least float32: the dtype weights are returned in."""
    sums_BK: torch.Tensor
    """float64: per response, the sums of ``row_sums.COLUMNS`` over its valid tokens."""
    behaviour_input_BT: torch.Tensor
    """mu as given (float32 or float64; half precision is upcast), not zeroed: the lazy tensors' source."""
    proximal_input_BT: torch.Tensor
    """old as given, like ``behaviour_input_BT``."""
    cpu_arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    """(mu, old, valid) as contiguous numpy arrays where the CPU kernels run, else None."""
    _tokens: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        """Valid tokens in the batch."""
        return int(self.num_valid_B.sum().item())

    @property
    def num_sequences(self) -> int:
        """Responses with at least one valid token."""
        return int(self.seq_valid_B.sum().item())

    def _token(self, name: str) -> torch.Tensor:
        if not self._tokens:
            self._tokens.update(
                _token_tensors(self.behaviour_input_BT, self.proximal_input_BT, self.valid_BT)
            )
        return self._tokens[name]

    @property
    def d_BT(self) -> torch.Tensor:
        """float64: old - mu, 0 where not valid (computed on first access)."""
        return self._token("d_BT")

    @property
    def dc_BT(self) -> torch.Tensor:
        """float64: clamp(d, -20, 20), 0 where not valid."""
        return self._token("dc_BT")

    @property
    def rho_BT(self) -> torch.Tensor:
        """float64: exp(dc) where valid, 0 elsewhere."""
        return self._token("rho_BT")

    @property
    def behaviour_BT(self) -> torch.Tensor:
        """float64: mu where valid, 0 elsewhere."""
        return self._token("behaviour_BT")

    @property
    def proximal_BT(self) -> torch.Tensor:
        """float64: old where valid, 0 elsewhere."""
        return self._token("proximal_BT")


def _token_tensors(behaviour_BT, proximal_BT, valid_BT) -> dict[str, torch.Tensor]:
    """The float64 [B, T] tensors of spec section 0, 0 where not valid."""
    mu_BT = torch.where(valid_BT, behaviour_BT.double(), 0.0)
    old_BT = torch.where(valid_BT, proximal_BT.double(), 0.0)
    d_BT = old_BT - mu_BT
    dc_BT = d_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho_BT = torch.where(valid_BT, dc_BT.exp(), 0.0)
    return {
        "d_BT": d_BT,
        "dc_BT": dc_BT,
        "rho_BT": rho_BT,
        "behaviour_BT": mu_BT,
        "proximal_BT": old_BT,
    }


def _check_inputs(behaviour_BT, proximal_BT, mask_BT) -> None:
    if behaviour_BT.dim() != 2:
        raise ValueError(f"behaviour_logp must be [B, T], got shape {tuple(behaviour_BT.shape)}")
    for name, t in (("proximal_logp", proximal_BT), ("mask", mask_BT)):
        if t.shape != behaviour_BT.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but behaviour_logp has {tuple(behaviour_BT.shape)}"
            )
    for name, t in (("behaviour_logp", behaviour_BT), ("proximal_logp", proximal_BT)):
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got {t.dtype}")


def uses_cpu_kernels(behaviour_BT: torch.Tensor) -> bool:
    """Whether the numba kernels compute the ratios of this batch (CPU tensors); torch otherwise."""
    return behaviour_BT.device.type == "cpu"


def _assemble(valid_BT, sums_BK, behaviour_BT, proximal_BT, weight_dtype, **extra) -> LogRatios:
    return LogRatios(
        valid_BT=valid_BT,
        weight_dtype=weight_dtype,
        sums_BK=sums_BK,
        behaviour_input_BT=behaviour_BT,
        proximal_input_BT=proximal_BT,
        **row_fields(sums_BK),
        **extra,
    )


def _kernel_ratios(behaviour_BT, proximal_BT, in_mask_BT, weight_dtype) -> LogRatios:
    """The fused CPU pass: float32 (or float64, if either input is) mu and old, read once."""
    dtype = (
        torch.float64 if torch.float64 in (behaviour_BT.dtype, proximal_BT.dtype) else torch.float32
    )
    behaviour_BT = behaviour_BT.to(dtype).contiguous()
    proximal_BT = proximal_BT.to(dtype).contiguous()
    mu_np, old_np = behaviour_BT.numpy(), proximal_BT.numpy()
    valid_np = np.empty(mu_np.shape, dtype=np.bool_)
    sums_np = np.empty((mu_np.shape[0], len(COLUMNS)))
    row_sums_kernel(mu_np, old_np, in_mask_BT.contiguous().numpy(), valid_np, sums_np)
    return _assemble(
        torch.from_numpy(valid_np), torch.from_numpy(sums_np), behaviour_BT, proximal_BT,
        weight_dtype, cpu_arrays=(mu_np, old_np, valid_np),
    )  # fmt: skip


def _torch_ratios(behaviour_BT, proximal_BT, in_mask_BT, weight_dtype) -> LogRatios:
    valid_BT, nonfinite_BT = valid_masks_BT(behaviour_BT, proximal_BT, in_mask_BT)
    tokens = _token_tensors(behaviour_BT, proximal_BT, valid_BT)
    sums_BK = row_sums_torch(tokens["behaviour_BT"], tokens["proximal_BT"], valid_BT, nonfinite_BT)
    return _assemble(valid_BT, sums_BK, behaviour_BT, proximal_BT, weight_dtype, _tokens=tokens)


def compute_log_ratios(behaviour_logp_BT, proximal_logp_BT, mask_BT) -> LogRatios:
    """Derive every per-token and per-sequence ratio of spec section 0 from ``(mu, old, mask)``.

    Inputs may be torch tensors or numpy arrays; ``mask`` may be bool, integer or float
    (non-zero = response token). Raises ``ValueError`` on shape or dtype mismatch.
    """
    behaviour_BT = torch.as_tensor(behaviour_logp_BT).detach()
    proximal_BT = torch.as_tensor(proximal_logp_BT).detach()
    mask_BT = torch.as_tensor(mask_BT, device=behaviour_BT.device).detach()
    _check_inputs(behaviour_BT, proximal_BT, mask_BT)
    weight_dtype = torch.promote_types(
        torch.promote_types(behaviour_BT.dtype, proximal_BT.dtype), torch.float32
    )
    in_mask_BT = mask_BT if mask_BT.dtype == torch.bool else mask_BT != 0
    if uses_cpu_kernels(behaviour_BT):
        return _kernel_ratios(behaviour_BT, proximal_BT, in_mask_BT, weight_dtype)
    return _torch_ratios(behaviour_BT, proximal_BT, in_mask_BT, weight_dtype)


def select_sequences(ratios: LogRatios, rows_B: torch.Tensor) -> LogRatios:
    """The ratios of a subset of responses (a bool mask or an index tensor over B), no recompute."""
    rows_B = torch.as_tensor(rows_B, device=ratios.valid_BT.device)
    if rows_B.dtype == torch.bool and rows_B.shape != ratios.num_valid_B.shape:
        raise ValueError(
            f"row mask has shape {tuple(rows_B.shape)} but the batch has {ratios.num_valid_B.numel()} responses"
        )
    valid_BT = ratios.valid_BT[rows_B]  # indexing copies: every part below is contiguous
    behaviour_BT = ratios.behaviour_input_BT[rows_B]
    proximal_BT = ratios.proximal_input_BT[rows_B]
    cpu_arrays = None
    if ratios.cpu_arrays is not None:
        cpu_arrays = (behaviour_BT.numpy(), proximal_BT.numpy(), valid_BT.numpy())
    tokens = {name: t[rows_B] for name, t in ratios._tokens.items()}
    return _assemble(
        valid_BT,
        ratios.sums_BK[rows_B],
        behaviour_BT,
        proximal_BT,
        ratios.weight_dtype,
        cpu_arrays=cpu_arrays,
        _tokens=tokens,
    )
