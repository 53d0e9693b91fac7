"""The strict base model every config section derives from."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Frozen, unknown keys rejected, attribute docstrings become field descriptions."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=True,
        populate_by_name=True,
    )
