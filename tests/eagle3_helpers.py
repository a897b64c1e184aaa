"""Helpers of the EAGLE-3 tests: random heads for a target, saved as published heads are (config.json +
model.safetensors with `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`, optionally `embed_tokens`)."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from met.model.config import ModelConfig
from met.model.eagle3 import Eagle3Config, Eagle3Head


def random_head(target: ModelConfig, draft_vocab: int | None = None, layers: tuple[int, ...] = (0, 1, 2),
                dim: int | None = None, own_embedding: bool = True, seed: int = 1, std: float = 0.3,
                dtype: torch.dtype = torch.float64) -> Eagle3Head:
    """A head of normal(0, std) weights for target, drafting over a random draft_vocab of its ids (None: all)."""
    dim = dim or target.dim
    vocab = target.vocab_size
    cfg = Eagle3Config(dim=dim, n_heads=4, n_kv_heads=2, head_dim=dim // 4, ffn_dim=2 * dim, vocab_size=vocab,
                       draft_vocab_size=draft_vocab or vocab, target_dim=target.dim, layers=layers,
                       max_seq_len=target.max_seq_len, norm_eps=1e-6, rope_theta=500.0)
    torch.manual_seed(seed)
    head = Eagle3Head(cfg, own_embedding)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, std)
        if draft_vocab is not None:  # a random subset of target ids, ascending as EAGLE's training writes them
            ids = torch.randperm(vocab)[:draft_vocab].sort().values
            head.d2t.copy_(ids - torch.arange(draft_vocab))
            head.t2d.zero_()
            head.t2d[ids] = True
    head.set_tables()
    return head.to(dtype).eval()


def save_head(folder: Path, head: Eagle3Head, layer_ids: bool = True, **config) -> Path:
    """Write head into folder in the published layout (layer_ids False: leave the target layers to vLLM's default)."""
    cfg = head.cfg
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": cfg.dim,
           "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
           "intermediate_size": cfg.ffn_dim, "num_hidden_layers": 1, "vocab_size": cfg.vocab_size,
           "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_dim,
           "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta, "hidden_act": "silu",
           "max_position_embeddings": 2048, "torch_dtype": "float32", "tie_word_embeddings": False}
    if layer_ids:
        doc["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.layers), "use_aux_hidden_state": True}
    (folder / "config.json").write_text(json.dumps(doc | config))
    state = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
