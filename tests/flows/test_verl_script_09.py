"""Reading verl 0.9-style launch scripts (flows/verl_script.py, flows/verl_script_flow.py): bash arrays, integer
arithmetic, if/case branches decided by known values, and the entry points outside verl.trainer. Every expected
value below is what bash itself prints for the same script (checked by hand with ``bash -c``)."""
from __future__ import annotations

import pytest

from flows.from_verl import convert
from flows.from_verl import main as from_verl_main
from flows.verl_script import read_script
from rlhf_core.config.errors import ConfigError

ARRAYS = r"""
MODEL=/m
DATA=(
    algorithm.adv_estimator=grpo   # a comment inside the array
    data.train_files="['/d/a.parquet', '/d/b.parquet']"
    # a comment line
    "trainer.experiment_name=two words"
)
DATA+=(data.max_prompt_length=$((1024 * 2)))
EMPTY=()
python3 -m verl.trainer.main_ppo "${DATA[@]}" actor_rollout_ref.model.path=${MODEL} "${EMPTY[@]}" "$@"
"""


def test_an_array_expands_to_one_word_per_element():
    [cmd] = read_script(ARRAYS, "a.sh").commands
    # bash: printf '%s\n' "${DATA[@]}" prints the 4 elements, quotes removed, the one with a space kept whole;
    # "${EMPTY[@]}" and "$@" are no words at all
    assert cmd.args == ["algorithm.adv_estimator=grpo", "data.train_files=['/d/a.parquet', '/d/b.parquet']",
                        "trainer.experiment_name=two words", "data.max_prompt_length=2048",
                        "actor_rollout_ref.model.path=/m"]
    assert cmd.unexpanded == {}


def test_an_unquoted_array_and_an_element_by_index():
    text = 'A=(x "y z")\nB=${A[1]}\npython3 -m verl.trainer.main_ppo k1=${A[0]} ${A[@]} "k2=$B"\n'
    [cmd] = read_script(text, "b.sh").commands
    # unquoted ${A[@]} is word-split: x, y, z (bash: printf '[%s]' ${A[@]} -> [x][y][z]); an assignment's value is
    # not (B=${A[1]} holds "y z")
    assert cmd.args == ["k1=x", "x", "y", "z", "k2=y z"]


def test_an_assigned_value_with_a_space_stays_one_value():
    # verl 0.9's EXPERIMENT_NAME=${EXPERIMENT_NAME:-name_$(date +%Y%m%d_%H%M)}: the default holds a space inside a
    # command substitution we never run; bash assigns it whole, so $EXPERIMENT_NAME is defined afterwards
    text = "N=${N:-run_$(date +%Y%m%d_%H%M)}\npython3 -m verl.trainer.main_ppo trainer.experiment_name=$N\n"
    script = read_script(text, "n.sh")
    assert script.variables["N"] == "run_$(date +%Y%m%d_%H%M)"
    [cmd] = script.commands
    assert cmd.args == ["trainer.experiment_name=run_$(date +%Y%m%d_%H%M)"]
    assert cmd.unexpanded == {"trainer.experiment_name=run_$(date +%Y%m%d_%H%M)": ["$(date +%Y%m%d_%H%M)"]}


@pytest.mark.parametrize("expr, value", [
    ("1024 * 2", "2048"), ("a + b", "7"), ("(a + b) * 2 - 1", "13"),
    ("7 / 2", "3"), ("-7 / 2", "-3"), ("-7 % 2", "-1"),  # bash divides as C: truncation toward zero
    ("$a * 10", "30"),
])
def test_integer_arithmetic_as_bash(expr, value):
    [cmd] = read_script(f"a=3\nb=4\npython3 -m verl.trainer.main_ppo k=$(({expr}))\n", "c.sh").commands
    assert cmd.args == [f"k={value}"]


@pytest.mark.parametrize("expr", ["n * 2", "1 / 0", "2 ** 3", "a < 1"])
def test_arithmetic_we_cannot_read_is_left_as_written(expr):
    # n is undefined, 1/0 is an error in bash, ** and < are not in what we evaluate: never a guessed number
    [cmd] = read_script(f"a=3\npython3 -m verl.trainer.main_ppo k=$(({expr}))\n", "d.sh").commands
    assert cmd.args == [f"k=$(({expr}))"] and cmd.unexpanded == {f"k=$(({expr}))": [f"$(({expr}))"]}


DEVICE_SCRIPT = r"""
DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}
EXTRA=()
case "${DEVICE}" in
    gpu | cuda)
        tp=2
        case "${MACHINE}" in
            gb200)
                EXTRA+=(actor_rollout_ref.rollout.enforce_eager=True)
                ;;
            *)
                n=8
                ;;
        esac
        ;;
    npu)
        tp=4
        EXTRA+=(actor_rollout_ref.actor.use_torch_compile=False)
        if [ "${BACKEND}" = sglang ]; then
            EXTRA+=(+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=ascend)
        fi
        ;;
esac
if [ "$tp" -gt 2 ] && [ -n "$tp" ]; then
    EXTRA+=(trainer.nnodes=2)
elif [ "$tp" = 2 ]; then
    EXTRA+=(trainer.nnodes=1)
else
    EXTRA+=(trainer.nnodes=9)
fi
python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.tensor_model_parallel_size=$tp "${EXTRA[@]}"
"""


def test_branches_follow_a_value_the_caller_sets():
    script = read_script(DEVICE_SCRIPT, "e.sh", {"DEVICE": "gpu", "MACHINE": "h100"})
    # DEVICE=gpu: the gpu clause (tp=2; MACHINE=h100 matches only *), then tp -gt 2 is false, tp = 2 true
    assert script.commands[0].args == ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.nnodes=1"]
    assert script.variables["n"] == "8" and script.branches == []
    script = read_script(DEVICE_SCRIPT, "e.sh", {"DEVICE": "npu", "BACKEND": "sglang", "MACHINE": ""})
    assert script.commands[0].args == ["actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                                       "actor_rollout_ref.actor.use_torch_compile=False",
                                       "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=ascend",
                                       "trainer.nnodes=2"]
    assert "n" not in script.variables


def test_an_undecided_branch_is_read_and_named():
    script = read_script(DEVICE_SCRIPT, "e.sh")
    # DEVICE's default is a command substitution we never run: every clause is read, in order (tp=4 last)
    args = script.commands[0].args
    assert args[0] == "actor_rollout_ref.rollout.tensor_model_parallel_size=4"
    assert "actor_rollout_ref.actor.use_torch_compile=False" in args
    # the case on DEVICE (line 4), the nested one on MACHINE (line 7: a variable the script never sets is the
    # caller's to set) and the if on BACKEND (line 19) are undecided; the if on tp (line 24) is not: the last
    # clause read set tp=4, so bash's own reading of "every clause" gives -gt 2 true -> nnodes=2
    assert [n.split(":")[0] for n in script.branches] == ["line 4", "line 7", "line 19"], script.branches
    assert args[-1] == "trainer.nnodes=2"


@pytest.mark.parametrize("module, implied", [
    ("verl.experimental.one_step_off_policy.main_ppo", ["async_training.mode=one_step_off_policy"]),
    ("verl.experimental.fully_async_policy.fully_async_main", ["async_training.mode=fully_async"]),
    ("recipe.dapo.main_dapo", [])])
def test_verl_09_entry_points_are_ppo_commands(module, implied):
    text = f"ray job submit --no-wait -- python3 -m {module} algorithm.adv_estimator=grpo\n"
    [cmd] = read_script(text, "f.sh").commands
    assert (cmd.module, cmd.stage, cmd.args) == (module, "ppo", implied + ["algorithm.adv_estimator=grpo"])
    assert f"line 1: {module} -> ppo" in convert(text, "f.sh").commands


def test_set_must_name_a_shell_variable(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo\n")
    with pytest.raises(ConfigError, match=r"--set '1X=gpu': expected NAME=VALUE"):
        from_verl_main(["from-verl", str(script), "--set", "1X=gpu"])


def test_a_test_guarding_one_command_is_decided_too():
    # bash: [ "$USE_KL" = 1 ] && ARGS+=(...) adds nothing with USE_KL=0; `|| ARGS+=(...)` adds; an undecided test
    # ($NG: a command substitution) reads its command and says so
    text = ('USE_KL=${USE_KL:-0}\nNG=$(nvidia-smi -L | wc -l)\nARGS=(a=1)\n'
            '[ "$USE_KL" = 1 ] && ARGS+=(kl=on)\n[[ "$USE_KL" == 1 ]] || ARGS+=(kl=off)\n'
            '[ "$NG" -gt 4 ] && ARGS+=(big=1)\npython3 -m verl.trainer.main_ppo "${ARGS[@]}"\n')
    script = read_script(text, "g.sh")
    assert script.commands[0].args == ["a=1", "kl=off", "big=1"]
    assert [n.split(":")[0] for n in script.branches] == ["line 6"]
    assert read_script(text, "g.sh", {"USE_KL": "1"}).commands[0].args == ["a=1", "kl=on", "big=1"]


def test_undecided_branches_say_whose_value_won():
    script = read_script(DEVICE_SCRIPT, "e.sh")
    # every clause of the undecided case on DEVICE (line 4) is read: tp=2 at line 6 (the gpu clause), then tp=4 at
    # line 17 (the npu clause) -- bash-by-hand reading keeps the last, 4 (test above); n=8 (line 12) is assigned only
    # inside the nested `*)` clause of the undecided case on MACHINE, so it is named too
    assert script.assignments == [
        "tp='4' from line 17 in the undecided branch `case ? in npu)` (line 16) is the value used (the last "
        "assignment read; also assigned at line 6 in `case ? in gpu | cuda)` (line 5)); choose the branch with --set",
        "n='8' from line 12 in the undecided branch `case ? in *)` (line 11) is the value used (the last assignment "
        "read); choose the branch with --set"]
    # decided branches leave nothing to say
    assert read_script(DEVICE_SCRIPT, "e.sh", {"DEVICE": "gpu", "MACHINE": "h100"}).assignments == []


def test_set_wins_over_the_scripts_own_assignment_with_a_notice():
    text = "N_GPUS=8\nSTEPS=${STEPS:-5}\npython3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$N_GPUS " \
           "trainer.total_training_steps=$STEPS\n"
    script = read_script(text, "s.sh", {"N_GPUS": "1", "STEPS": "3"})
    # --set N_GPUS=1 wins over line 1's N_GPUS=8 (named); STEPS=${STEPS:-5} takes the caller's 3 (no conflict)
    assert script.commands[0].args == ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=3"]
    assert script.assignments == ["--set N_GPUS='1' overrides the script's N_GPUS='8' (line 1)"]
    conv = convert(text, "s.sh", {"N_GPUS": "1"})
    assert "--set N_GPUS='1' overrides the script's N_GPUS='8' (line 1)" in conv.notes


UV_LAUNCH = r"""
B=${B:-vllm}
RAY=(ray_kwargs.ray_init.runtime_env.py_executable=null)
if [ "${VERL_USE_UV:-1}" != 0 ] && [ "${DEVICE:-gpu}" = gpu ] && { [ "${B}" = vllm ] || [ "${B}" = sglang ]; }; then
    RAY=(ray_kwargs.ray_init.runtime_env.py_executable="uv run")
fi
python3 -m verl.trainer.main_ppo "${RAY[@]}"
"""


@pytest.mark.parametrize("given, value", [
    ({"VERL_USE_UV": "0"}, "null"),           # bash: false && ... -> the if is not taken
    ({"B": "hf"}, "null"),                    # true && true && { false || false; } -> not taken
    ({"B": "sglang"}, "uv run"),              # true && true && { false || true; } -> taken
    ({}, "uv run")])                          # the defaults: 1 != 0, gpu = gpu, vllm = vllm -> taken
def test_a_braced_group_in_a_condition_is_one_operand(given, value):
    # verl 0.9's run_qwen3_8b_fsdp.sh launch block (abridged); the group was cut at its `||` and read undecided
    script = read_script(UV_LAUNCH, "u.sh", given)
    assert script.commands[0].args == [f"ray_kwargs.ray_init.runtime_env.py_executable={value}"]
    assert script.branches == []
