"""data.tool_config_path / data.function_tool_path: the overlong filter measures each prompt with the rollout's
tool schemas in the chat template (verl 0.9.1 RLHFDataset.maybe_filter_out_long_prompts)."""
from __future__ import annotations

import copy

import pytest

from tests.fixtures.data_fixtures import ppo_data_cfg, verl_row, write_parquet

from rlhf_core.data.prompts import encode
from rlhf_core.data.rl_dataset import RLHFDataset
from rlhf_core.models.tiny import CHAT_TEMPLATE
from rlhf_core.tools import ToolConfigError

QUESTIONS = ["How many apples?", "Tom has 3 cats and 2 dogs. How many pets does he have in total?",
             "A train leaves at noon going 60 miles per hour; when does it arrive 150 miles away at the station?"]
# ChatML after one line per tool: "name: description\n" (real templates render the whole JSON schema)
TOOLS_TEMPLATE = "{% for t in tools or [] %}{{ t['function']['name'] + ': ' + t['function']['description'] + '\n' }}" \
                 "{% endfor %}" + CHAT_TEMPLATE
TOOLS_PY = '''from rlhf_core.tools import function_tool


@function_tool
def multiply(a: int, b: int) -> str:
    """Multiply two integers and return the product as text.

    Args:
        a: the first factor
        b: the second factor
    """
    return str(a * b)
'''
TOOLS_YAML = """tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: multiply
        description: Multiply two integers and return the product as text.
        parameters: {type: object, properties: {a: {type: integer}}, required: []}
"""


@pytest.fixture
def tools_tokenizer(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TOOLS_TEMPLATE
    return tok


@pytest.mark.parametrize("key,name,text", [("function_tool_path", "tools.py", TOOLS_PY),
                                           ("tool_config_path", "tools.yaml", TOOLS_YAML)])
def test_overlong_filter_counts_the_tool_schemas(tools_tokenizer, tmp_path, key, name, text):
    data = write_parquet(tmp_path / "q.parquet", [verl_row(q, "1", index=i) for i, q in enumerate(QUESTIONS)])
    (tmp_path / name).write_text(text)
    lengths = [len(encode(tools_tokenizer, tools_tokenizer.apply_chat_template(
        [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False))) for q in QUESTIONS]
    # the template puts "multiply: <description>\n" before "<|im_start|>" (a special token, so the pre-tokenizer
    # splits there): each prompt grows by the k tokens of that line
    k = len(encode(tools_tokenizer, "multiply: Multiply two integers and return the product as text.\n"))
    limit = lengths[2]  # every prompt fits without the tools
    plain = RLHFDataset(data, tools_tokenizer, ppo_data_cfg(max_prompt_length=limit, filter_overlong_prompts=True))
    assert plain.row_numbers == [0, 1, 2]
    cfg = ppo_data_cfg(max_prompt_length=limit, filter_overlong_prompts=True, **{key: str(tmp_path / name)})
    with_tools = RLHFDataset(data, tools_tokenizer, cfg)
    expected = [i for i, n in enumerate(lengths) if n + k <= limit]
    assert with_tools.row_numbers == expected and 0 in expected and 2 not in expected
    # as in verl, only the filter sees the tools: an item's ids are the plain rendering
    assert with_tools[0]["raw_prompt_ids"] == plain[0]["raw_prompt_ids"]


def test_a_bad_tool_file_fails_the_filter_naming_it(tiny_tokenizer, tmp_path):
    data = write_parquet(tmp_path / "q.parquet", [verl_row(QUESTIONS[0], "1")])
    cfg = ppo_data_cfg(filter_overlong_prompts=True, function_tool_path=str(tmp_path / "missing.py"))
    with pytest.raises(ToolConfigError, match="function_tool_path .*missing.py: no such file"):
        RLHFDataset(data, tiny_tokenizer, cfg)
