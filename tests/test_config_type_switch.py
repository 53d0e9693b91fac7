"""What a ``type`` switch between config layers resets, said on the console (``type_switch_notes``)."""

from system.config import RunConfig, dump_config
from system.config.loading import type_switch_notes


def test_a_type_switch_names_the_earlier_layers_fields_it_reset(tmp_path):
    """A switch replaces the mapping whole: the preset's shared_memory false and chunk_mb 16 become the
    collective's defaults (true, 64); rank is delta's own (not listed), chunk_mb set beside the switch
    is the user's (not listed); a switch away from the schema's defaults reports nothing."""
    p = tmp_path / "p.yaml"
    p.write_text("weight_sync: {type: delta, shared_memory: false, chunk_mb: 16, rank: 8}\n")
    (note,) = type_switch_notes([p], ["weight_sync.type=collective"])
    assert "weight_sync.type delta -> collective (the overrides)" in note
    assert "weight_sync.shared_memory (false -> true), weight_sync.chunk_mb (16 -> 64)" in note
    assert "rank" not in note
    (note,) = type_switch_notes([p], ["weight_sync.type=collective", "weight_sync.chunk_mb=32"])
    assert "weight_sync.shared_memory (false -> true) took" in note and "chunk_mb" not in note
    assert type_switch_notes([p], ["weight_sync.type=collective", "weight_sync.chunk_mb=16",
                                   "weight_sync.shared_memory=false"]) == []
    assert type_switch_notes([p], ["weight_sync.type=object_store"]) == []  # it has none of those fields
    assert type_switch_notes([p], ["weight_sync.chunk_mb=8"]) == []  # no switch
    assert type_switch_notes([], ["correction.method.type=icepop"]) == []  # from the schema's defaults
    # between two presets: the second preset is named
    q = tmp_path / "q.yaml"
    q.write_text("correction: {method: {type: seq-mis, hi: 2.0}}\n")
    r = tmp_path / "r.yaml"
    r.write_text("correction: {method: {type: icepop}}\n")
    (note,) = type_switch_notes([q, r])
    assert f"preset {str(r)!r}" in note and "correction.method.hi (2.0 -> 5.0)" in note


def test_type_switch_notes_follow_the_layers_after_the_switch_and_the_old_types_defaults(tmp_path):
    """Found by a review: a field a later layer sets is not a default; a layer without ``type`` before one
    that names the default type is no switch; after a switch back the note names the final type; a saved
    config.json (every field) reports only values that were not the old type's own defaults; a YAML date
    that a switch dropped is printed, not a TypeError."""
    p, q, d = tmp_path / "p.yaml", tmp_path / "q.yaml", tmp_path / "d.yaml"
    p.write_text("weight_sync: {type: delta, shared_memory: false, chunk_mb: 16, rank: 8}\n")
    q.write_text("weight_sync: {type: collective}\n")
    d.write_text("weight_sync: {type: delta}\n")
    (note,) = type_switch_notes([p, q], ["weight_sync.shared_memory=true"])
    assert "weight_sync.chunk_mb (16 -> 64)" in note and "shared_memory" not in note
    (note,) = type_switch_notes([p, q, d])  # delta -> collective -> delta: delta's defaults
    assert note.startswith("weight_sync.type collective -> delta")
    assert "weight_sync.rank (8 -> 4)" in note and note.endswith("took delta's default; set them again beside "
                                                                  "the switch to keep the earlier value")
    untyped, typed = tmp_path / "nt.yaml", tmp_path / "st.yaml"
    untyped.write_text("correction: {method: {hi: 2}}\n")
    typed.write_text("correction: {method: {type: seq-mis}}\n")  # the default's type: no switch
    assert type_switch_notes([untyped, typed], ["correction.method.hi=4"]) == []
    saved = tmp_path / "config.json"
    saved.write_text(dump_config(RunConfig()))  # every field, seq-mis at its defaults (hi 3)
    assert type_switch_notes([saved], ["correction.method.type=icepop"]) == []
    saved.write_text(dump_config(RunConfig.model_validate({"correction": {"method": {"type": "seq-mis", "hi": 2.0}}})))
    (note,) = type_switch_notes([saved], ["correction.method.type=icepop"])
    assert "so correction.method.hi (2.0 -> 5.0) took icepop's default" in note
    dated = tmp_path / "date.yaml"
    dated.write_text("correction: {method: {type: seq-mis, hi: 2024-01-01}}\n")
    (note,) = type_switch_notes([dated], ["correction.method.type=icepop"])
    assert 'correction.method.hi ("2024-01-01" -> 5.0)' in note
