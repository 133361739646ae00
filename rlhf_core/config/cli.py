"""`rlhf config show|check [--config-name NAME] [--config-dir DIR] [--world-size N] [overrides]`."""

from __future__ import annotations

import argparse
import sys
import warnings

from rlhf_core.cli import run_command

from .errors import ConfigError
from .loader import CONFIG_NAMES, load_config, resolved_yaml
from .notices import ConfigNotice, engine_errors
from .validate import validate_ppo_config, validate_sft_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlhf config", description="Show or check a verl-style config.")
    p.add_argument("action", choices=("show", "check"), help="show: print the resolved YAML; check: validate only")
    p.add_argument("--config-name", default="ppo_trainer",
                   help=f"one of {', '.join(CONFIG_NAMES)}, sft_trainer_engine (verl 0.9's SFT defaults) or a path to a YAML file (default ppo_trainer)")
    p.add_argument("--config-dir", default=None, help="a folder of <name>.yaml files to load instead of the shipped defaults (default: "
                        "the config classes' defaults, which rlhf_core/configs/*.yaml show)")
    p.add_argument("--world-size", type=int, default=None,
                   help="training workers to validate against (default trainer.nnodes x trainer.n_gpus_per_node)")
    p.add_argument("overrides", nargs="*", help="verl/Hydra overrides: a.b=v, +a.new=v, ~a.b")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run `rlhf config ...` with ``argv`` (without the leading 'config'); return the exit code.

    0 = valid (show also prints the resolved YAML to stdout); 1 = invalid config (one line naming the key on
    stderr), or, for check, a rollout engine (``rollout.name``) whose package is not importable here; 2 = bad
    command line (argparse). Keys that will change nothing are listed as "Notice:" lines on stderr. See
    :mod:`rlhf_core.cli`.
    """
    def command(argv: list[str]) -> int:
        args = _parser().parse_intermixed_args(argv)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecationWarning)
            cfg = load_config(args.config_name, args.overrides, args.config_dir)
            if args.world_size is not None and "actor_rollout_ref" in cfg:
                validate_ppo_config(cfg, args.world_size)
            elif args.world_size is not None and "optim" in cfg:
                validate_sft_config(cfg, args.world_size)
            if args.action == "check" and engine_errors(cfg):
                raise ConfigError(engine_errors(cfg)[0])
        for w in caught:
            kind = "Notice" if issubclass(w.category, ConfigNotice) else "Warning"
            print(f"{kind}: {w.message}", file=sys.stderr)
        if args.action == "show":
            sys.stdout.write(resolved_yaml(cfg))
        else:
            print(f"OK: {args.config_name} is valid", file=sys.stderr)
        return 0

    return run_command("rlhf config", command, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
