"""Config of the correction service: the IS method (a union on ``type``) and AIS.

Defaults follow ``CORRECTION_SPEC.md`` section 2 and 3. The default method is ``seq-mis``
with ``hi = 3``.

A run's config (``CorrectionConfig``) also refuses thresholds that make no sense for a
correction: a band ``[lo, hi]`` that does not hold the on-policy ratio 1 strictly inside
(it would reject sequences or tokens whose ratio is 1 up to noise), or a truncation cap
``c < 1`` (it would truncate the on-policy ratio itself). The method classes alone accept
them, so that tests of the weight formulas can build any band.
"""

from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from system.config.base import StrictModel
from system.registry import config_types


class _MethodBase(StrictModel):
    veto: float | None = Field(default=None, gt=0.0, lt=1.0)
    """Catastrophe veto: drop a whole sequence if any token has ``d < log(veto)``; unset = off (1e-4 when used)."""
    self_normalize: bool = False
    """Divide the weights by their mean over valid tokens (token methods) or sequences (sequence methods)."""

    def label(self) -> str:
        """The method and its set fields, for messages: ``seq-mis hi=3.0 self_normalize=False``."""
        fields = (f"{k}={v}" for k, v in self.model_dump().items() if k != "type" and v is not None)
        return " ".join((self.type, *fields))

    def threshold_problems(self) -> dict[str, str]:
        """Field -> why its threshold would make this method reject or truncate the on-policy ratio 1."""
        problems = {}
        c = getattr(self, "c", None)
        if c is not None and c < 1.0:
            problems["c"] = f"{self.type} c ({c}) must be >= 1: a truncation cap below 1 truncates the on-policy ratio 1 itself"
        lo, hi = getattr(self, "lo", None), getattr(self, "hi", None)
        if hi is not None and hi <= 1.0:
            problems["hi"] = (f"{self.type} hi ({hi}) must be > 1: the kept band must hold the on-policy ratio 1 "
                              f"(hi <= 1 rejects every ratio just above 1)")
        if lo is not None and lo >= 1.0:
            problems["lo"] = (f"{self.type} lo ({lo}) must be < 1: the kept band must hold the on-policy ratio 1 "
                              f"(lo >= 1 rejects every ratio just below 1)")
        return problems


class NoCorrection(_MethodBase):
    type: Literal["none"] = "none"
    """Weight 1 for every valid token."""


class TokenTIS(_MethodBase):
    type: Literal["token-tis"] = "token-tis"
    """Token-level truncated IS: ``w = min(rho, c)``."""
    c: float = Field(default=2.0, gt=0.0)
    """Truncation cap C."""


class IcePop(_MethodBase):
    type: Literal["icepop"] = "icepop"
    """Token-level masked IS: ``w = rho`` inside ``[lo, hi]``, else 0."""
    lo: float = Field(default=0.5, gt=0.0)
    """Lower bound of the kept band."""
    hi: float = Field(default=5.0, gt=0.0)
    """Upper bound of the kept band."""

    @model_validator(mode="after")
    def _ordered(self) -> "IcePop":
        if self.lo >= self.hi:
            raise ValueError(f"lo ({self.lo}) must be < hi ({self.hi})")
        return self


class SeqTIS(_MethodBase):
    type: Literal["seq-tis"] = "seq-tis"
    """Sequence-level truncated IS: ``w = min(rho_seq, c)`` for every token of the sequence."""
    c: float = Field(default=2.0, gt=0.0)
    """Truncation cap C."""


class SeqMIS(_MethodBase):
    type: Literal["seq-mis"] = "seq-mis"
    """Sequence-level masked IS: ``w = rho_seq`` if ``log lo <= L <= log hi``, else 0."""
    hi: float = Field(default=3.0, gt=0.0)
    """Upper threshold on the sequence ratio."""
    lo: float | None = Field(default=None, gt=0.0)
    """Optional lower threshold on the sequence ratio (unset = one-sided)."""

    @model_validator(mode="after")
    def _ordered(self) -> "SeqMIS":
        if self.lo is not None and self.lo >= self.hi:
            raise ValueError(f"lo ({self.lo}) must be < hi ({self.hi})")
        return self


class GeoRS(_MethodBase):
    type: Literal["geo-rs"] = "geo-rs"
    """Geometric rejection sampling: keep a sequence iff ``log lo <= L/T <= log hi``."""
    lo: float = Field(default=0.999, gt=0.0)
    """Lower bound on the geometric-mean ratio (tuned for BF16; calibrate for FP8)."""
    hi: float = Field(default=1.001, gt=0.0)
    """Upper bound on the geometric-mean ratio."""

    @model_validator(mode="after")
    def _ordered(self) -> "GeoRS":
        if self.lo >= self.hi:
            raise ValueError(f"lo ({self.lo}) must be < hi ({self.hi})")
        return self


MethodConfig = Annotated[
    NoCorrection | TokenTIS | IcePop | SeqTIS | SeqMIS | GeoRS,
    Field(discriminator="type"),
]
METHOD_TYPES: tuple[str, ...] = config_types(MethodConfig)


class AISConfig(StrictModel):
    """AIS version 2 (spec section 3; the alpha rule is our reconstruction from the paper's abstract)."""

    enabled: bool = False
    """Apply ``omega = k (1 + alpha (w - 1))`` instead of the method's w (alpha is computed and logged either way)."""
    beta: float = Field(default=0.5, ge=0.0, lt=1.0)
    """EMA coefficient of alpha: ``alpha = beta * alpha_prev + (1 - beta) * alpha_raw``, alpha_0 = 0."""
    c: float = Field(default=2.0, gt=0.0)
    """Truncation cap of the reliability R (it sets n_eff = n R) and variance diagnostics."""
    per_lag: bool = False
    """One alpha (and EMA) per lag bucket, applied to that bucket's sequences, instead of one per batch."""


class AlarmConfig(StrictModel):
    """Drift alarm of the correction service (``system/correction/alarm.py``): a one-line warning and a W&B
    alert naming the likely cause (lag-0 mismatch vs staleness) when a threshold is crossed."""

    enabled: bool = True
    """Check the thresholds every step (metric ``mismatch/alarm`` is 0 or 1 either way; 0 when disabled)."""
    kl_k1_max: float = Field(default=0.5, gt=0.0)
    """Fire when ``mismatch/kl_k1`` (mean ``mu - old`` over valid tokens) is above this; lag 0's kl above half
    of it points to quantization/kernels."""
    ess_seq_min: float = Field(default=0.5, ge=0.0, le=1.0)
    """Fire when ``mismatch/ess_seq`` (sequence-level ESS fraction of the ratios) is below this."""
    keep_seq_frac_min: float = Field(default=0.8, ge=0.0, le=1.0)
    """Fire when ``correction/keep_seq_frac`` (responses the applied weights keep) is below this."""


class CorrectionConfig(StrictModel):
    method: MethodConfig = Field(default_factory=SeqMIS)
    """The importance-sampling correction applied to the policy loss (default seq-mis, hi = 3)."""

    ais: AISConfig = Field(default_factory=AISConfig)
    """Adaptive importance sampling on top of the method."""

    alarm: AlarmConfig = Field(default_factory=AlarmConfig)
    """Drift alarm on kl_k1, ess_seq and the kept fraction, with its likely cause from the lag split."""

    max_nothing_kept_steps: int | None = Field(default=10, ge=0)
    """Consecutive steps whose applied weights keep no token (``correction/keep_token_frac`` 0: they train
    nothing) before the run stops with an error; null never stops (``system/correction/nothing_kept.py``)."""

    @model_validator(mode="after")
    def _meaningful_thresholds(self) -> "CorrectionConfig":
        problems = self.method.threshold_problems()
        if problems:  # a ValidationError, so that each error sits at its field (correction.method.hi)
            raise ValidationError.from_exception_data(type(self).__name__, [
                InitErrorDetails(type=PydanticCustomError("meaningless_threshold", message),
                                 loc=("method", field), input=getattr(self.method, field))
                for field, message in problems.items()
            ])
        return self
