"""Turn ``global_step_N/actor`` (or ``/critic``) into a plain Hugging Face directory (verl ``model_merger``).

Reads the sharded DCP ``model/`` folder in a single process (no process group needed), builds the model from
``huggingface/config.json`` and writes ``save_pretrained`` weights + the tokenizer into ``target_dir``.
A verl 0.6 FSDP checkpoint (``model_world_size_W_rank_R.pt`` shards beside ``huggingface/``) is read too
(:mod:`rlhf_core.workers.verl_checkpoint`), so a verl run can be brought over.
Usage: ``rlhf merge --local-dir CKPT/global_step_N/actor --target-dir OUT`` (``main(argv)``), or verl's
``rlhf merge merge --backend fsdp --local_dir … --target_dir …``.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys

import torch

from rlhf_core.atomic import atomic_directory
from rlhf_core.cli import run_command
from rlhf_core.data import DataError
from rlhf_core.safe_load import dcp_load_full
from rlhf_core.workers.verl_checkpoint import is_verl_checkpoint, load_verl_fsdp_state_dict



def _merge_lora(state: dict[str, torch.Tensor], hf_dir: str) -> dict[str, torch.Tensor]:
    """``merge_lora_state_dict`` with ``alpha`` from ``huggingface/adapter_config.json`` (written at save time)."""
    import json

    with open(os.path.join(hf_dir, "adapter_config.json")) as f:
        return merge_lora_state_dict(state, json.load(f).get("lora_alpha", 16))


def merge_lora_state_dict(state: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """Fold peft LoRA weights (``...lora_A.default.weight`` / ``lora_B``) into base weights (W + B·A·alpha/r) and
    strip peft's prefixes, giving plain HF key names (also used to feed vLLM from a LoRA actor)."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if ".lora_" in k or ".original_module." in k:
            continue
        name = re.sub(r"^base_model\.model\.", "", k).replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        out[name] = v
        if k.endswith(".base_layer.weight"):
            a = state[k.replace(".base_layer.weight", ".lora_A.default.weight")]
            b = state[k.replace(".base_layer.weight", ".lora_B.default.weight")]
            r = a.shape[0]
            out[name] = v + (b @ a).to(v.dtype) * (alpha / r)
    return out


def merge_checkpoint(local_dir: str, target_dir: str, trust_remote_code: bool = False) -> str:
    """Write a ``from_pretrained``-loadable directory for the checkpoint at ``local_dir``; returns ``target_dir``.

    ``local_dir`` is ours (DCP ``model/``, or full ``huggingface`` weights) or verl 0.6's FSDP layout
    (``model_world_size_W_rank_R.pt`` + ``fsdp_config.json``); weights keep their saved dtype.

    Raises ``FileNotFoundError`` when ``local_dir`` lacks ``huggingface/config.json`` or any weights, or a verl
    rank's shard; ``ValueError`` when a merged verl weight's shape differs from the config's model;
    ``CheckpointError`` when a weights file holds Python objects other than tensors (nothing of it runs:
    :mod:`rlhf_core.safe_load`).
    ``trust_remote_code`` (verl model_merger's ``--trust-remote-code``; off by default) lets the checkpoint's
    config run its own Python code (``auto_map``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    hf_dir = os.path.join(local_dir, "huggingface")
    if not os.path.exists(os.path.join(hf_dir, "config.json")):
        raise FileNotFoundError(f"{hf_dir}/config.json not found: is {local_dir} an actor/critic checkpoint folder?")
    config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
    model_dir = os.path.join(local_dir, "model")
    if is_verl_checkpoint(local_dir):
        with torch.device("meta"):
            shapes = {k: v.shape for k, v in AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code).state_dict().items()}
        state = load_verl_fsdp_state_dict(local_dir, shapes)
    elif os.path.isdir(model_dir):
        state = dcp_load_full(model_dir)
    elif os.path.exists(os.path.join(hf_dir, "model.safetensors")):
        from safetensors.torch import load_file

        state = load_file(os.path.join(hf_dir, "model.safetensors"))
    else:
        raise FileNotFoundError(f"no model weights in {local_dir} (neither model/, verl's "
                                f"model_world_size_W_rank_R.pt nor huggingface/model.safetensors)")
    if any(".lora_" in k for k in state):
        state = _merge_lora(state, hf_dir)
    # a critic (value head ``score``, no ``lm_head``) keeps the LM's ``architectures`` in its config: decide by keys
    is_value_model = "score.weight" in state and "lm_head.weight" not in state
    cls = AutoModelForTokenClassification if is_value_model else AutoModelForCausalLM
    if is_value_model:
        config.num_labels = 1
        config.architectures = [type(config).__name__.replace("Config", "ForTokenClassification")]
    with torch.device("meta"):
        model = cls.from_config(config, trust_remote_code=trust_remote_code)
    model.load_state_dict(state, strict=False, assign=True)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise DataError(f"{local_dir}: the checkpoint lacks weights for {missing[:5]} ...")
    if getattr(config, "tie_word_embeddings", False) and hasattr(model, "tie_weights"):
        model.tie_weights()
    with atomic_directory(target_dir.rstrip("/")) as tmp:
        model.save_pretrained(tmp)
        for name in os.listdir(hf_dir):  # tokenizer files + generation config
            if name not in ("config.json", "model.safetensors", "adapter_config.json") and os.path.isfile(os.path.join(hf_dir, name)):
                shutil.copy2(os.path.join(hf_dir, name), os.path.join(tmp, name))
    return target_dir


def main(argv: list[str] | None = None) -> int:
    """``rlhf merge [merge] --local-dir DIR --target-dir OUT``; returns the exit code (0 ok; 1 not a checkpoint,
    one line on stderr; 2 bad command line). verl's own form ``merge --backend fsdp --local_dir … --target_dir …``
    (``python -m verl.model_merger merge ...``) works as it is, the leading ``merge`` included."""
    parser = argparse.ArgumentParser(prog="rlhf merge", description=__doc__.splitlines()[0],
                                     epilog="verl's form works too: rlhf merge merge --backend fsdp "
                                            "--local_dir ckpt/global_step_10/actor --target_dir hf_model")
    parser.add_argument("operation", nargs="?", choices=["merge"], default="merge",
                        help="verl model_merger's operation word (only merge; optional)")
    # verl's model_merger spells them --local_dir / --target_dir: both spellings work
    parser.add_argument("--local-dir", "--local_dir", dest="local_dir", required=True,
                        help="global_step_N/actor (or critic) folder")
    parser.add_argument("--target-dir", "--target_dir", dest="target_dir", required=True,
                        help="output Hugging Face directory")
    parser.add_argument("--backend", default="fsdp", choices=["fsdp"], help="checkpoint format (verl compatible flag)")
    parser.add_argument("--trust-remote-code", "--trust_remote_code", dest="trust_remote_code", action="store_true",
                        help="let the checkpoint's config run its own Python code (auto_map); off by default")

    def command(args: list[str]) -> int:
        ns = parser.parse_args(args)
        print(f"merged {ns.local_dir} -> {merge_checkpoint(ns.local_dir, ns.target_dir, ns.trust_remote_code)}")
        return 0

    return run_command("rlhf merge", command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
