"""The one registry style: entries keyed by the ``type`` of a config's discriminated union.

Correction methods, policy losses, loss aggregations, advantages, rewards and prompt sources each
keep one ``Registry``: built once at import from a plain dict, it refuses (at import) a dict that
does not cover exactly the config's types, and a lookup of an unknown type raises a ``ValueError``
naming the config field and the known types.
"""

from collections.abc import Iterator, Mapping
from typing import Annotated, Generic, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")


def config_types(annotation) -> tuple[str, ...]:
    """The allowed ``type`` values of a config annotation, in declaration order: a ``Literal`` of
    names, or a pydantic discriminated union (optionally ``Annotated``) of models with a ``type``."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is Literal:
        return tuple(get_args(annotation))
    types = []
    for member in get_args(annotation) or (annotation,):
        types.extend(get_args(member.model_fields["type"].annotation))
    return tuple(types)


class Registry(Mapping[str, T], Generic[T]):
    """A read-only mapping ``config type -> entry`` for the config field ``field`` (e.g.
    ``"correction.method.type"``), exactly covering ``types``."""

    def __init__(self, field: str, types: tuple[str, ...], entries: dict[str, T]) -> None:
        missing, extra = set(types) - set(entries), set(entries) - set(types)
        if missing or extra:
            raise TypeError(f"the {field} registry must cover exactly {sorted(types)}: "
                            f"missing {sorted(missing)}, unknown {sorted(extra)}")
        self.field = field
        self._entries = {t: entries[t] for t in types}

    def __getitem__(self, key: str) -> T:
        entry = self._entries.get(key)
        if entry is None:
            raise ValueError(f"{self.field} {key!r} is not one of {sorted(self._entries)}")
        return entry

    def get(self, key: str, default=None):
        return self._entries.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
