"""`phalanx export --format peft` and `--merge-adapters`: a peft model's adapters, or the model
with its adapters merged, from a checkpoint, in peft's and Hugging Face's own formats.

The checkpoint holds the whole model under peft's names; the run directory's `model/` folder,
written by the Trainer (phalanx.train.adapters.record_model), holds its Hugging Face config
(naming the model class) and its adapter config. The model is rebuilt from those on the meta
device, given the checkpoint's tensors, and written by peft and transformers themselves
(`save_pretrained`, `merge_and_unload`): the files are exactly theirs, and load with
`PeftModel.from_pretrained(base, OUT)` or `AutoModelForCausalLM.from_pretrained(OUT)`.
The directory is built under a temporary name and renamed into place.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from phalanx.checkpoint import files
from phalanx.checkpoint.export import check_apart, frozen_left_out, locate_step, read_weights
from phalanx.checkpoint.export_safetensors import check_out_dir, replace_dir
from phalanx.checkpoint.frozen import check_unchanged, fingerprint
from phalanx.checkpoint.pretrained import need_safetensors
from phalanx.errors import UsageError
from phalanx.rundir.layout import MODEL_DIR

ADAPTER_FILE = "adapter_model.safetensors"
PEFT_FILES = frozenset({ADAPTER_FILE, "adapter_config.json", "README.md"})
"""What peft's save_pretrained writes besides a safetensors export's files."""


def export_adapters(
    checkpoint: Path, out: Path, *, merge: bool = False, model_dir: Path | None = None
) -> tuple[Path, int]:
    """Write the adapters of `checkpoint` (merged into the model with `merge`) to the directory
    `out`; returns the step directory used and the number of tensors written."""
    check_apart(checkpoint, out)
    check_out_dir(out.resolve(), None, also=PEFT_FILES)
    source = locate_step(checkpoint)
    folder = _model_dir(checkpoint, source, model_dir)
    model = _rebuild(folder, source, merge=merge)
    tmp = out.resolve().with_name(f".{out.name}.peft{files.TMP_SUFFIX}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if merge:
            model = model.merge_and_unload()
            model.save_pretrained(tmp, safe_serialization=True)
            count = sum(1 for _ in model.state_dict())
        else:
            model.save_pretrained(tmp)
            adapters = need_safetensors().safe_open(str(tmp / ADAPTER_FILE), "pt")
            count = len(adapters.keys())
        files.fsync_dir(tmp)
        replace_dir(tmp, out.resolve())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return source, count


def _model_dir(checkpoint: Path, source: Path, given: Path | None) -> Path:
    """`given`, else the run directory's model/ folder (beside checkpoints/, above the step
    directory): one that holds both configs."""
    needed = ("config.json", "adapter_config.json")
    if given is not None:
        lacking = [name for name in needed if not (given / name).is_file()]
        if lacking:
            raise UsageError(f"--model-dir '{given}' has no {' or '.join(lacking)}; pass the "
                             "model/ folder of the run that trained the adapters")  # fmt: skip
        return given
    for run in (checkpoint, source.parent.parent, source.parent):
        if all((run / MODEL_DIR / name).is_file() for name in needed):
            return run / MODEL_DIR
    raise UsageError(
        f"no {MODEL_DIR}/adapter_config.json in the run directory of '{checkpoint}': the "
        "Trainer writes it for a peft model (get_peft_model); pass --model-dir DIR holding "
        "the model's config.json and adapter_config.json"
    )


def _rebuild(folder: Path, source: Path, *, merge: bool) -> Any:
    """The peft model of `folder`'s configs given the checkpoint's tensors. A checkpoint that
    left its frozen base out (checkpoint.save_frozen=false) gets it from where the adapter config
    says the base is, for a merge (checked against the checkpoint's fingerprint of it); the
    adapters alone need no base (it stays on the meta device)."""
    try:
        import peft
        import transformers
    except ImportError as error:
        raise UsageError(
            f"--format peft and --merge-adapters need peft and transformers ({error.name} is "
            "missing): pip install 'phalanx[lora]'"
        ) from None
    adapter = peft.PeftConfig.from_pretrained(str(folder))
    config = transformers.AutoConfig.from_pretrained(folder)
    # The base model the adapters were trained on, as the adapter config names it (else peft
    # would name this folder as the base in the export).
    config._name_or_path = adapter.base_model_name_or_path or ""
    names = getattr(config, "architectures", None) or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:
        raise UsageError(f"{folder / 'config.json'} names no transformers model class "
                         f"(architectures: {names}); pass --model-dir with one")  # fmt: skip
    frozen = frozen_left_out(source)
    base = _base(cls, config, adapter.base_model_name_or_path) if frozen and merge else None
    with torch.device("meta"):
        base = base if base is not None else cls(config)
    model = peft.get_peft_model(base, adapter)
    missing, unexpected = model.load_state_dict(read_weights(source), strict=False, assign=True)
    missing = sorted(set(missing) - set(frozen["names"] if frozen else []))
    if missing or unexpected:
        raise UsageError(
            f"the checkpoint does not hold the model {folder} describes: {len(missing)} tensor(s) "
            f"missing (e.g. {missing[:2]}), {len(unexpected)} unexpected (e.g. {unexpected[:2]})"
        )
    if frozen and merge:
        check_unchanged(frozen, fingerprint(model), source)
    return model


def _base(cls: Any, config: Any, path: str | None) -> Any:
    """The frozen base, from the local model directory the adapter config names."""
    if not path or not Path(path).is_dir():
        raise UsageError(
            f"the checkpoint leaves out the frozen base (checkpoint.save_frozen=false) and the "
            f"adapter config's base_model_name_or_path {path!r} is no local model directory: "
            "export the adapters with --format peft and merge them where the base is"
        )
    return cls.from_pretrained(path, config=config)
