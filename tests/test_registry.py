"""The one registry style (``system.registry``) and the five registries built with it."""

from typing import Literal

import pytest
from pydantic import BaseModel

from system.registry import Registry, config_types


class _A(BaseModel):
    type: Literal["a"] = "a"


class _B(BaseModel):
    type: Literal["b", "b2"] = "b"


def test_config_types_reads_literals_and_unions():
    assert config_types(Literal["x", "y"]) == ("x", "y")
    assert config_types(_A | _B) == ("a", "b", "b2")


def test_a_registry_must_cover_exactly_the_config_types():
    with pytest.raises(TypeError, match=r"missing \['b'\], unknown \['c'\]"):
        Registry("demo.type", ("a", "b"), {"a": 1, "c": 3})


def test_an_unknown_type_names_the_field_and_the_known_types():
    reg = Registry("demo.type", ("a", "b"), {"b": 2, "a": 1})
    assert list(reg) == ["a", "b"] and reg["b"] == 2 and len(reg) == 2  # the config's order
    assert reg.get("zzz") is None and "a" in reg and "zzz" not in reg
    with pytest.raises(ValueError, match=r"demo.type 'zzz' is not one of \['a', 'b'\]"):
        reg["zzz"]


def test_every_registry_covers_its_config_field():
    """The five registries are ``Registry`` objects keyed exactly by their config field's types."""
    from system.config.correction import MethodConfig
    from system.config.data import RewardConfig, TaskConfig
    from system.config.learner import LearnerConfig, LossConfig
    from system.correction.methods import METHOD_REGISTRY
    from system.data.prompt_source import PROMPT_SOURCES
    from system.losses.aggregation import AGGREGATIONS
    from system.losses.registry import POLICY_LOSSES
    from system.rewards.registry import REWARDS

    expected = {
        "correction.method.type": (METHOD_REGISTRY, config_types(MethodConfig)),
        "learner.loss.type": (POLICY_LOSSES, config_types(LossConfig)),
        "learner.aggregation": (AGGREGATIONS, config_types(LearnerConfig.model_fields["aggregation"].annotation)),
        "data.reward.type": (REWARDS, config_types(RewardConfig)),
        "data.task.type": (PROMPT_SOURCES, config_types(TaskConfig)),
    }
    for field, (registry, types) in expected.items():
        assert isinstance(registry, Registry) and registry.field == field
        assert tuple(registry) == types, field
