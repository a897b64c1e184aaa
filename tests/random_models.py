"""Random micro models for the tests: weights far from their init (std 0.3), so that layouts and paths tell apart."""

from pathlib import Path

import torch

from met.model.config import ModelConfig
from met.model.dflash import DflashConfig, DflashDrafter
from met.model.transformer import Transformer


def random_micro(seed: int = 0) -> Transformer:
    """The micro preset with normal(0, 0.3) weights, float32, in eval mode."""
    torch.manual_seed(seed)
    m = Transformer(ModelConfig.from_name("micro"))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return m.eval()


def micro_model(seed: int = 0) -> Transformer:
    """random_micro in float64, so batch shape and rounding cannot flip a greedy token."""
    return random_micro(seed).double()


def random_dflash(target: Transformer, block: int = 8) -> DflashDrafter:
    """A DFlash block drafter for target with seeded random weights (ffn 64: small and quick)."""
    torch.manual_seed(1)
    return DflashDrafter(DflashConfig.for_target(target.cfg, block=block, ffn_dim=64))


def hf_checkpoint(folder: Path, family: str, seed: int = 0, **overrides):
    """A random tiny folder of family (llama | qwen2 | qwen3 | mistral) saved by transformers; the HF model (float64).

    Llama and Qwen2 are checkpoint_helpers.checkpoint's; Qwen3 and Mistral the same sizes (48 wide,
    4 heads over 2 kv heads, context 256) and the same normal(0, 0.25) weights, q_norm and k_norm too.
    """
    import transformers
    from checkpoint_helpers import checkpoint, tokenizer

    if family in ("llama", "qwen2"):
        return checkpoint(folder, family, seed, **overrides)
    config_cls, model_cls = {"qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
                             "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM)}[family]
    cfg = config_cls(**(dict(vocab_size=tokenizer(folder), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             bos_token_id=0, eos_token_id=1, rms_norm_eps=1e-6, rope_theta=500.0) | overrides))
    torch.manual_seed(seed)
    model = model_cls(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.25)
    model.save_pretrained(folder)
    return model.double().eval()
