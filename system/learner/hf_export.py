"""A run's trained policy as a Hugging Face model directory (``aisrl export``).

The learner checkpoints with DCP (``system.learner.checkpoint``): FSDP2 shards of the fp32 master
weights under ``checkpoints/step_N/learner/``, keyed ``model.<parameter name>``. A user who trained a
policy wants it where ``from_pretrained``, vLLM and the rest of the ecosystem read it (verl's model
merger and TRL's saves do the same job). The export:

1. reads the run's ``config.json`` and builds (or finds in the cache) the run's model directory: the
   architecture, its config and the tokenizer come from there;
2. takes the newest checkpoint whose files are whole (sizes and CRC-32s, as a resume chooses), or the
   one of ``--step``, refused by name when it is not;
3. loads every parameter of the checkpoint, resharded into whole tensors in this one process (DCP's
   ``no_dist`` load), into that model; a parameter the checkpoint lacks must be tied to one it holds
   (``lm_head`` = the embeddings when ``tie_word_embeddings``), anything else is refused by name, as is
   a shape that differs or a value that is not finite;
4. writes the model in ``dtype`` (bfloat16, the precision the policy computed and was served in, or
   float32, the master weights) with ``save_pretrained`` (safetensors), the tokenizer, and
   ``aisrl_export.json`` (run, step, policy version, dtype) into ``out.partial``, renamed to ``out``
   when complete: an interrupted export leaves no directory that looks finished.
"""

import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from system.config import resolve_config
from system.config.resume import check_saved_config
from system.learner.checkpoint_files import checkpoint_problems
from system.learner.model import load_causal_lm, param_dtype_of
from system.models.model_dir import resolve_model_dir
from system.run_state import (
    checkpoint_dir,
    is_complete_checkpoint,
    learner_dir,
    usable_run_checkpoint,
)

EXPORT_INFO = "aisrl_export.json"
_PREFIX = "model."  # the learner saves {"model": model state, "optim": ...}; DCP flattens the keys


class ExportError(ValueError):
    """An export that cannot be done, worded for the user (names the run, checkpoint or parameter)."""


def choose_checkpoint(run_dir: Path, step: int | None) -> tuple[Path, int]:
    """``(checkpoint, step)``: the newest one whose halves are whole (``run_state.usable_run_checkpoint``,
    as a resume picks it: a damaged newer one is passed over), or ``step``'s, which must be whole."""
    if step is None:
        found, saved, skipped = usable_run_checkpoint(run_dir)
        if found is None:
            raise ExportError(f"{run_dir}: no usable checkpoint under {run_dir / 'checkpoints'} (a run writes one "
                              "every checkpoint_every steps and at its end)" + (f"; {'; '.join(skipped[:3])}"
                                                                              if skipped else ""))
        return found, saved["step"]
    found = checkpoint_dir(run_dir, step)
    if not is_complete_checkpoint(found):
        raise ExportError(f"--step {step}: {found} is not a complete checkpoint of {run_dir}")
    problems = checkpoint_problems(learner_dir(found))
    if problems:
        raise ExportError(f"{found} cannot be read whole: {'; '.join(problems[:3])}")
    return found, step


def load_policy(model_dir: str, learner: str, trust_remote_code: bool = False) -> torch.nn.Module:
    """The run's architecture from ``model_dir`` with the parameters of the DCP checkpoint ``learner``."""
    model = load_causal_lm(model_dir, trust_remote_code)
    saved = dcp.FileSystemReader(learner).read_metadata().state_dict_metadata
    state = model.state_dict()
    wanted = {}
    for name, tensor in state.items():
        meta = saved.get(_PREFIX + name)
        if meta is None:
            continue
        if tuple(meta.size) != tuple(tensor.shape):
            raise ExportError(f"{learner}: parameter {name} has shape {tuple(meta.size)} in the checkpoint, "
                              f"{tuple(tensor.shape)} in the run's model {model_dir}")
        wanted[name] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    if not wanted:
        raise ExportError(f"{learner}: no parameter of the run's model {model_dir} is in this checkpoint")
    with warnings.catch_warnings():  # "torch.distributed is disabled ...": one process is the intent here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load({"model": wanted}, checkpoint_id=learner, no_dist=True)
    bad = next((n for n, t in wanted.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad is not None:
        raise ExportError(f"{learner}: parameter {bad} holds non-finite values")
    missing = set(model.load_state_dict(wanted, strict=False).missing_keys)
    loaded_storage = {t.untyped_storage().data_ptr() for n, t in model.state_dict().items() if n in wanted}
    untied = sorted(n for n in missing if model.state_dict()[n].untyped_storage().data_ptr() not in loaded_storage)
    if untied:
        raise ExportError(f"{learner}: the checkpoint has no {', '.join(untied[:5])}"
                          f"{' ...' if len(untied) > 5 else ''} (parameters of the run's model {model_dir})")
    return model


def check_out_path(run_dir: Path, out: Path) -> None:
    """Refuse an ``--out`` that is the run directory, lies inside it or holds it (``--overwrite`` replaces
    ``--out`` whole: a review's ``aisrl export RUN --out RUN --overwrite`` deleted the run), or that has
    no name of its own (``/``: nothing to put the new directory beside)."""
    run, target = run_dir.resolve(), out.resolve()
    if not target.name:
        raise ExportError(f"--out {out}: not a directory that can be replaced (give a new directory's path)")
    if target == run or run in target.parents or target in run.parents:
        where = "is" if target == run else "is inside" if run in target.parents else "holds"
        raise ExportError(f"--out {out} {where} the run directory {run_dir}: export to a directory outside the run")


def export_policy(run_dir: str | Path, out: str | Path, step: int | None = None, dtype: str = "bfloat16",
                  overwrite: bool = False) -> dict:
    """Write the policy of ``run_dir``'s checkpoint (newest, or ``step``'s) to ``out`` as a Hugging Face
    model directory; returns what ``aisrl_export.json`` records."""
    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "config.json").is_file():
        raise ExportError(f"{run_dir}: no config.json there (not a run directory)")
    check_out_path(run_dir, out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())) and not overwrite:
        raise ExportError(f"--out {out} exists and is not an empty directory: pass --overwrite to replace it")
    check_saved_config(run_dir / "config.json", f"export {run_dir}")
    # the run's directory as a value, not YAML text (a directory named 2024-01-01 read as a date)
    cfg = resolve_config([str(run_dir / "config.json")], fixed=("export", {"output_dir": str(run_dir)}))
    ckpt, step = choose_checkpoint(run_dir, step)
    learner = learner_dir(ckpt)
    trust = getattr(cfg.model, "trust_remote_code", False)
    model_dir = resolve_model_dir(cfg)
    model = load_policy(model_dir, learner, trust).to(param_dtype_of(dtype))
    with open(os.path.join(learner, "trainer.json")) as f:
        counters = json.load(f)["counters"]
    info = {"run_dir": str(run_dir.resolve()), "checkpoint": str(Path(ckpt).resolve()), "step": step,
            "policy_version": counters.get("policy_version"), "dtype": dtype, "model_dir": model_dir}

    from transformers import AutoTokenizer

    out = out.resolve()  # ".": its name is the working directory's
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model.config.use_cache = True  # the learner turns the KV cache off; generation wants it
        model.save_pretrained(partial, safe_serialization=True)
        AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust).save_pretrained(partial)
        (partial / EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return info
