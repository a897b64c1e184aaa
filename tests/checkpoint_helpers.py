"""Helpers of the checkpoint tests: tiny random Llama, Qwen2, Qwen3 and Mistral folders saved by transformers, with a
tokenizer.json."""

from pathlib import Path

import torch

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\nprint(os.getcwd())\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "café, naïve, 日本語, emoji 😀 and ünïcödé text\n",
    "for i in range(10):\n    print(i * i)\n",
] * 4


def tokenizer(folder: Path, vocab: int = 320) -> int:
    """Train a byte-level BPE on CORPUS, save folder/tokenizer.json; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size()


def checkpoint(folder: Path, family: str = "llama", seed: int = 0, shard: str | None = None, **overrides):
    """A random tiny model of `family` (llama | qwen2 | qwen3 | mistral) saved to folder with a tokenizer; returns
    the HF model (float64). Qwen3's q_norm and k_norm are drawn like every other weight.

    Weights are drawn wider than transformers' init, so no two logits are near a tie and greedy
    text is the same in met and transformers.
    """
    import transformers

    vocab = tokenizer(folder)
    common = dict(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0,
                  eos_token_id=1, rms_norm_eps=1e-6)
    config_cls, cls, defaults = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"rope_theta": 500.0}),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"tie_word_embeddings": True}),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"rope_theta": 500.0}),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"rope_theta": 500.0}),
    }[family]
    cfg = config_cls(**(common | defaults | overrides))
    torch.manual_seed(seed)
    model = cls(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.25)
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return model.double().eval()


def hf_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy generate: the new tokens (EOS dropped, as met reports them)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=model.config.eos_token_id, pad_token_id=model.config.eos_token_id)
    new = out[0, len(prompt):].tolist()
    eos = model.config.eos_token_id
    return new[: new.index(eos)] if eos in new else new
