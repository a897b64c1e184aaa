"""Export the main model as a Hugging Face LlamaForCausalLM checkpoint folder (the MTP module is dropped)."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from met.model.tokenizer import BOS, EOS
from met.model.transformer import Transformer


def hf_config(model: Transformer) -> dict:
    """config.json of the equivalent LlamaForCausalLM."""
    cfg = model.cfg
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "torch_dtype": "float32",
    }


def export_hf(model: Transformer, folder: Path) -> Path:
    """Write config.json and model.safetensors for transformers' from_pretrained; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()
             if not k.startswith("mtp.")}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(model), indent=2) + "\n")
    return folder
