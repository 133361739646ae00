"""verl/Hydra override forms: a.b=v, +a.new=v, ++a.b=v, ~a.b, lists, dicts, interpolations."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from rlhf_core.config import ConfigError, apply_overrides, load_config, parse_override, parse_value


@pytest.mark.parametrize("text,expected", [
    ("1e-6", 1e-6),            # YAML 1.1 would read this as a string; verl/Hydra read a float
    ("0.", 0.0), (".5", 0.5), ("-3", -3), ("42", 42),
    ("True", True), ("false", False), ("null", None),
    ("inf", math.inf),
    ("abc", "abc"), ("my run", "my run"), ("", ""),
    ("'1e-6'", "1e-6"),         # quoted stays a string
    ('"a,b"', "a,b"),
    ("[console,mlflow]", ["console", "mlflow"]),
    ("['console', 'mlflow']", ["console", "mlflow"]),
    ("[]", []), ("[1, [2, 3]]", [1, [2, 3]]),
    ("{a: 1, b: [x, y]}", {"a": 1, "b": ["x", "y"]}),
    ("${data.max_prompt_length}", "${data.max_prompt_length}"),
    ("${oc.env:HOME,/tmp}", "${oc.env:HOME,/tmp}"),   # comma inside an interpolation is not a sweep
])
def test_parse_value(text, expected):
    assert parse_value(text) == expected
    assert type(parse_value(text)) is type(expected)


def test_unquoted_comma_is_rejected_as_a_sweep():
    with pytest.raises(ConfigError, match=r"Hydra sweep.*key=\[a,b\]"):
        parse_override("trainer.logger=console,mlflow")


@pytest.mark.parametrize("text,op,key", [
    ("a.b=1", "set", "a.b"), ("+a.new=1", "add", "a.new"), ("++a.b=1", "force", "a.b"),
    ("~a.b", "delete", "a.b"), ("~a.b=1", "delete", "a.b"),
])
def test_parse_override_prefixes(text, op, key):
    ov = parse_override(text)
    assert (ov.op, ov.key) == (op, key)


def test_set_add_force_delete_on_a_config():
    cfg = OmegaConf.create({"a": {"b": 1, "c": "${a.b}"}})
    apply_overrides(cfg, ["a.b=2", "+a.new=x", "++a.d=[1,2]", "~a.c"])
    assert OmegaConf.to_container(cfg) == {"a": {"b": 2, "new": "x", "d": [1, 2]}}


def test_set_unknown_key_names_nearest():
    cfg = OmegaConf.create({"trainer": {"test_freq": 2, "save_freq": -1}})
    with pytest.raises(ConfigError, match=r"Unknown config key 'trainer.tset_freq'.*Did you mean 'trainer.test_freq'"):
        apply_overrides(cfg, ["trainer.tset_freq=3"])


def test_plus_on_existing_key_is_an_error_like_hydra():
    cfg = OmegaConf.create({"a": {"b": 1}})
    with pytest.raises(ConfigError, match=r"already at 'a.b'.*'\+\+a.b=\.\.\.'"):
        apply_overrides(cfg, ["+a.b=2"])


def test_delete_missing_or_mismatched_value_is_an_error():
    cfg = OmegaConf.create({"a": {"b": 1}})
    with pytest.raises(ConfigError, match="nothing to delete"):
        apply_overrides(cfg, ["~a.x"])
    with pytest.raises(ConfigError, match=r"its value is 1, not 2"):
        apply_overrides(cfg, ["~a.b=2"])
    apply_overrides(cfg, ["~a.b=1"])
    assert "b" not in cfg.a


def test_interpolations_resolve_after_overrides():
    # rollout.prompt_length = ${data.max_prompt_length}: the override must flow through
    cfg = load_config("ppo_trainer", ["data.max_prompt_length=256", "actor_rollout_ref.actor.use_dynamic_bsz=True"])
    assert cfg.actor_rollout_ref.rollout.prompt_length == 256
    assert cfg.critic.use_dynamic_bsz is True and cfg.reward_model.use_dynamic_bsz is True
    # an override can itself be an interpolation
    cfg = load_config("ppo_trainer", ["data.max_response_length=${data.max_prompt_length}"])
    assert cfg.actor_rollout_ref.rollout.response_length == 512


def test_list_override_through_load_config():
    cfg = load_config("ppo_trainer", ["trainer.logger=[console,mlflow]", "actor_rollout_ref.actor.optim.lr=3e-6",
                                      "ray_init.timeline_json_file=null"])
    assert list(cfg.trainer.logger) == ["console", "mlflow"]
    assert cfg.actor_rollout_ref.actor.optim.lr == 3e-6
    assert cfg.ray_init.timeline_json_file is None


def test_typed_config_refuses_keys_outside_the_schema_and_deleting_schema_keys():
    # a loaded config holds exactly the schema's keys: a '+' key the YAML lacks is named with the file to add it to
    with pytest.raises(ConfigError, match=r"trainer.my_tag.*not a key of ppo_trainer: declare it in its class in rlhf_core/config/schemas/"):
        load_config("ppo_trainer", ["+trainer.my_tag=abc"])
    with pytest.raises(ConfigError, match=r"'trainer.critic_warmup' was deleted \(override "
                                          r"'~trainer.critic_warmup'\)"):
        load_config("ppo_trainer", ["~trainer.critic_warmup"])
    # Hydra treats a null value as absent: '~' on it is an error of Hydra's rules
    with pytest.raises(ConfigError, match="null"):
        load_config("ppo_trainer", ["~ray_init.timeline_json_file"])


def test_open_dict_takes_new_keys_with_plus():
    cfg = load_config("ppo_trainer", ["+actor_rollout_ref.model.override_config.model_config.attention_dropout=0.1"])
    assert cfg.actor_rollout_ref.model.override_config.model_config.attention_dropout == 0.1


def test_result_is_struct_so_later_typos_fail():
    cfg = load_config("evaluation")
    with pytest.raises(Exception):
        cfg.data.pth = "x"


def test_overrides_must_be_a_list_not_a_string():
    with pytest.raises(TypeError):
        apply_overrides(OmegaConf.create({"a": 1}), "a=2")


# ---- Hydra's grammar and rules (what verl's command line means), from Hydra's override-grammar docs -------------
@pytest.mark.parametrize("text,expected", [
    ("'a,b'", "a,b"),                      # quoted: a string, the comma is no sweep
    ("\"it's\"", "it's"),                  # the other quote inside
    ("'it\\'s'", "it's"),                  # an escaped quote of the same kind
    ("a\\,b", "a,b"),                      # an escaped comma in an unquoted value
    ("a\\ b", "a b"),                      # an escaped space
    ("  abc  ", "abc"),                    # unquoted: surrounding whitespace dropped
    ("'  abc  '", "  abc  "),              # quoted: kept
    ("'1e-6'", "1e-6"), ("1e-6", 1e-6),    # quoting decides the type
    ("NULL", None), ("null", None), ("'null'", "null"),
    ("{a: 1, b: {c: [x, 'y,z']}}", {"a": 1, "b": {"c": ["x", "y,z"]}}),
    ("int(3.0)", 3),                       # Hydra's cast functions
])
def test_hydra_values(text, expected):
    assert parse_value(text) == expected
    assert type(parse_value(text)) is type(expected)


def test_sweep_function_and_config_group_package_are_refused():
    with pytest.raises(ConfigError, match="sweep"):
        parse_override("a.b=choice(1,2)")
    with pytest.raises(ConfigError, match="config-group"):
        parse_override("a@pkg=1")
    with pytest.raises(ConfigError, match="Cannot parse override 'a.b=\\[1,2'"):
        parse_override("a.b=[1,2")
    with pytest.raises(ConfigError, match=r"Cannot parse override 'trainer.total_epochs' \(an override is KEY=VALUE"):
        parse_override("trainer.total_epochs")  # a forgotten "=2": the hint says what an override looks like


def test_hydra_rules_for_plus_plusplus_dicts_null_and_delete():
    cfg = OmegaConf.create({"a": {"n": None, "d": {"x": 1}, "v": 5, "s": "keep"}})
    # '+' where the value is null is allowed (Hydra: null counts as absent), and a dict '+' merges
    apply_overrides(cfg, ["+a.n=3", "+a.d={y: 2}"])
    assert cfg.a.n == 3 and OmegaConf.to_container(cfg.a.d) == {"x": 1, "y": 2}
    # a plain set of a dict merges into the existing dict; a new key in it needs '+' (the config is in struct
    # mode, as Hydra's); '++' sets an existing key or adds a new one
    apply_overrides(cfg, ["a.d={x: 5}", "++a.v=6", "++a.new.deep=[1, null]"])
    assert OmegaConf.to_container(cfg.a.d) == {"x": 5, "y": 2}
    with pytest.raises(ConfigError, match=r"(?s)Could not override 'a.d'.*'\+a.d=\{z: 3\}'"):
        apply_overrides(cfg, ["a.d={z: 3}"])
    assert cfg.a.v == 6 and list(cfg.a.new.deep) == [1, None]
    # 'null' sets None; '~key' deletes; '~key=value' deletes only when the value matches
    apply_overrides(cfg, ["a.v=null", "~a.new", "~a.s=keep"])
    assert cfg.a.v is None and "new" not in cfg.a and "s" not in cfg.a
    with pytest.raises(ConfigError, match="null"):
        apply_overrides(cfg, ["~a.v"])  # now null: Hydra says it does not exist
    with pytest.raises(ConfigError, match=r"Did you mean 'a.d'"):
        apply_overrides(cfg, ["a.dd={k: 1}"])  # our 'did you mean' kept on the Hydra path


def test_free_form_dict_takes_new_sub_keys_without_plus():
    # ours (a free_form dict, schema.open_paths()): Hydra's struct mode would ask for '+'; the preset writes it without
    cfg = load_config("ppo_trainer", ["custom_reward_function.reward_kwargs={format_score: 0.1}",
                                      "custom_reward_function.reward_kwargs={scale: 2}"])
    assert OmegaConf.to_container(cfg.custom_reward_function.reward_kwargs) == {"format_score": 0.1, "scale": 2}
