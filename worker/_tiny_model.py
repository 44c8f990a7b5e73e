"""``heddle model tiny``: a random-weight Llama that vLLM's CPU build loads in seconds.

Hidden size 128 with 2 heads (head_dim 64: the CPU attention kernels reject
16), 2 layers, a byte-level BPE tokenizer trained on the spot, and a ChatML
chat template with Hermes/Qwen tool-call tags. Nothing is downloaded. Needs
the ``vllm`` extra (torch, transformers, tokenizers).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_tiny_model"]

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "system user assistant tool",
    'What is 2 + 2? The answer is 4. <tool_call>{"name": "calc", "arguments": {}}</tool_call>',
]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_model(path: Path, *, vocab_size: int = 512, layers: int = 2, seed: int = 0) -> Path:
    """Write the model and tokenizer into ``path`` (created); return it."""
    import torch  # noqa: PLC0415 - optional extra
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import (  # noqa: PLC0415
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 50, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path
