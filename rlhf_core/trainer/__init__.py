"""Drivers: PPO (``ppo_trainer``, ``main_ppo``), SFT (``sft_trainer``, ``sft_worker``, ``main_sft``), evaluation
(``evaluation``, ``main_eval``), checkpoint layout and retention (``checkpoint_manager``), metric sinks
(``tracking``). Modules are imported on use; nothing heavy is imported here."""
