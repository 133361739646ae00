"""The kernels' one seam (``rlhf_core/kernels``): nothing happens at import, :func:`kernels.install` registers the
attention functions, :func:`kernels.support` describes a model once, the package imports no higher layer, and the
actor's forward path is chosen at init."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import OPTConfig, OPTForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlhf_core import kernels
from rlhf_core.kernels import KernelSupport, support

REPO = Path(__file__).resolve().parents[3]


def _qwen2(attn: str = "sdpa") -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = attn
    return Qwen2ForCausalLM(cfg)


def test_importing_the_workers_changes_no_attention_until_install():
    # a fresh interpreter: importing every module that uses the kernels leaves transformers' "sdpa" its own and
    # registers nothing; install() then puts varlen_sdpa and the grouped decode attention in place, idempotently
    code = """
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
import rlhf_core.workers.fsdp_workers, rlhf_core.workers.reward_model, rlhf_core.trainer.sft_worker
import rlhf_core.trainer.main_generation
from rlhf_core import kernels
from rlhf_core.kernels.grouped_attention import ATTN_NAME, grouped_attention
from rlhf_core.kernels.packing import varlen_sdpa
m = AttentionInterface._global_mapping
assert m["sdpa"] is sdpa_attention_forward and ATTN_NAME not in m and not kernels.installed(), m["sdpa"]
kernels.install(); kernels.install()
assert m["sdpa"] is varlen_sdpa and m[ATTN_NAME] is grouped_attention and kernels.installed()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_packed_forward_before_install_names_the_missing_step(monkeypatch):
    from rlhf_core.kernels import packing

    monkeypatch.setattr(kernels, "_INSTALLED", False)
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with pytest.raises(RuntimeError, match=r"a packed forward needs rlhf_core.kernels.install\(\)"):
        packing.packed_logits(_qwen2(), ids, mask, pos)


def test_support_describes_a_llama_form_decoder_and_refuses_opt_once():
    model = _qwen2()
    got = support(model)
    # a stock Qwen2 causal LM on SDPA with full attention: every kernel serves it
    assert got == KernelSupport(packing_refusal=None, sdpa_full_attention=True, varlen_attention=True,
                                decode_step=True, shared_prefix=True, logits_to_keep=True, active_dropout=False)
    assert support(model) is got  # computed once per model object
    eager = support(_qwen2("eager"))  # eager attention: packs through transformers, no per-sequence attention
    assert eager.packable and not eager.varlen_attention and not eager.decode_step and not eager.sdpa_full_attention
    opt = support(OPTForCausalLM(OPTConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                                           num_attention_heads=2, word_embed_proj_dim=16, max_position_embeddings=32)))
    assert opt.packing_refusal.startswith("model_type 'opt' is not one whose packed forward was checked")
    assert not opt.varlen_attention and not opt.decode_step
    with pytest.raises(ValueError, match=r"critic.model.use_remove_padding=True: model_type 'opt'"):
        kernels.prepare(OPTForCausalLM(OPTConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                                                 num_attention_heads=2, word_embed_proj_dim=16)),
                        "critic.model.use_remove_padding")


def test_kernels_import_no_higher_layer():
    # kernels sits below workers/trainer: it may import torch, transformers, the standard library and
    # rlhf_core.{kernels, models, config, utils} only
    allowed = ("rlhf_core.kernels", "rlhf_core.models", "rlhf_core.config", "rlhf_core.utils")
    found = []
    for path in sorted((REPO / "rlhf_core" / "kernels").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{path.name}: {n}" for n in names if n.startswith("rlhf_core") and not n.startswith(allowed)]
    assert found == []


def test_the_actor_chooses_its_forward_path_at_init(monkeypatch):
    from rlhf_core.config.loader import load_config
    from rlhf_core.protocol import Batch
    from rlhf_core.workers import actor as actor_mod

    cfg = load_config("ppo_trainer", []).actor_rollout_ref.actor
    model = _qwen2()
    dp = actor_mod.DataParallelPPOActor(cfg, model, use_remove_padding=True)
    # on CPU: packed, with the shared prefix tried first (each repeated prompt once), the LM head on kept positions
    assert (dp._path.packed, dp._path.shared_prefix, dp._path.logits_to_keep, dp._path.device.type) == (
        True, True, True, "cpu")

    def refuse(*args):
        raise AssertionError("the forward path is chosen at init, not per call")

    monkeypatch.setattr(actor_mod, "choose_response_forward", refuse)
    ids = torch.tensor([[0, 3, 4, 10, 11], [5, 6, 7, 12, 13]])
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    batch = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                   "responses": ids[:, -2:]}, {}, {"temperature": 1.0})
    log_probs, _ = dp.compute_log_prob(batch, micro_batch_size=2, calculate_entropy=False)
    with torch.no_grad():  # the padded forward's log-probs of the same rows (packing changes rounding only)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=batch["position_ids"]).logits[:, -3:-1]
    expected = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -2:, None])[..., 0]
    torch.testing.assert_close(log_probs, expected, rtol=1e-5, atol=1e-5)
