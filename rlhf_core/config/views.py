"""Config views: another shipped name for a config with other defaults (``--config-name sft_trainer_engine``).

verl 0.9 trains SFT with ``verl.trainer.sft_trainer`` and its ``sft_trainer_engine.yaml``: the same trainer as 0.6's
``fsdp_sft_trainer`` with keys moved (``model.path``, ``engine.*``, ``optim.lr_scheduler_type``; each an alias of
the 0.6 key here, see rlhf_core/config/schemas/sft_trainer.py) and other defaults. The view is the ``sft_trainer``
config with those defaults; every key and check is the ``sft_trainer`` one.

verl's Hydra group choices on the command line (``engine=fsdp optim=fsdp``) pick the defaults' files: the FSDP
ones are what the view already holds, so they are accepted and dropped; another backend (``engine=megatron``) is
refused by name.
"""

from __future__ import annotations

from typing import Sequence

from .errors import ConfigError

# view name -> (config it is a view of, {dotted key: verl 0.9.1's default where it differs from ours})
VIEWS: dict[str, tuple[str, dict[str, object]]] = {
    "sft_trainer_engine": ("sft_trainer", {
        "model.partial_pretrain": "~/models/deepseek-llm-7b-chat",
        "data.val_files": None,
        "data.use_dynamic_bsz": True,
        "data.pad_mode": "no_padding",
        "data.multiturn.enable": True,  # verl 0.9's engine SFT reads every dataset as message lists
        "model.enable_gradient_checkpointing": True,
        "use_remove_padding": True,
        "model.strategy": "fsdp",
        "optim.lr": 1e-3,
        "optim.betas": [0.9, 0.999],
        "optim.lr_scheduler": "constant",
        "optim.warmup_steps_ratio": 0.0,
        "trainer.n_gpus_per_node": 1,
    }),
}

# verl 0.9.1 keys of the view whose value here differs from verl's, and why (tests/rlhf_core/config/test_sft_engine_config.py)
DIFFERENCES: dict[str, dict[str, str]] = {
    "sft_trainer_engine": {
        "trainer.device": "auto: cuda when there is one, else cpu (verl's default is cuda)",
        "data.num_workers": "0: the samples are read in the driver process (verl's 8 DataLoader processes take cores "
                            "from the training threads on CPU; see the key's help)",
    },
}

# Hydra config-group choices of the view (``engine=fsdp``): accepted values, and what the others are
GROUPS: dict[str, tuple[tuple[str, ...], str]] = {
    "engine": (("fsdp",), "the FSDP engine is the only SFT engine here (Megatron, VeOmni, TorchTitan are backends "
                          "this project does not have)"),
    "optim": (("fsdp",), "the FSDP optimizer config is the only one here"),
    "model": (("hf_model",), "Hugging Face models only"),
    "profiler": (("profiler",), "the one profiler config"),
}


def view_of(name: str) -> tuple[str, dict[str, object]] | None:
    """(config name, default changes) of the view ``name``, or None when ``name`` is not a view."""
    return VIEWS.get(name)


def drop_group_choices(overrides: Sequence[str], kind: str) -> list[str]:
    """``overrides`` without verl's Hydra group choices (``engine=fsdp``) for an SFT config.

    Raises:
        ConfigError: a group set to a config this project does not have (``engine=megatron``), naming it.
    """
    if kind != "sft_trainer":
        return list(overrides)
    out = []
    for text in overrides:
        name, eq, value = text.partition("=")
        group = name.strip()
        if eq and group in GROUPS:
            allowed, why = GROUPS[group]
            if value.strip() not in allowed:
                raise ConfigError(f"{group}={value.strip()}: only {group}={allowed[0]} is supported; {why}")
            continue
        out.append(text)
    return out
