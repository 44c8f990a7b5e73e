"""``heddle model tiny``: a random-weight Llama that vLLM's CPU build loads in seconds.

Hidden size 128 with 2 heads (head_dim 64: the CPU attention kernels reject
16), 2 layers, a byte-level BPE tokenizer trained on the spot, and a
Qwen2.5-style chat template (default system prompt, tool schemas, Hermes
tool-call tags). Nothing is downloaded. Needs the ``vllm`` extra (torch,
transformers, tokenizers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "DEFAULT_SYSTEM_PROMPT", "tiny_tokenizer", "write_tiny_model"]

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "system user assistant tool",
    'What is 2 + 2? The answer is 4. <tool_call>{"name": "calc", "arguments": {}}</tool_call>',
]
# Shaped like Qwen2.5's template (written for Heddle): a default system prompt when the
# conversation has none, tool schemas in the system turn, tool calls as Hermes tags, and
# consecutive tool results grouped in one user turn. Those are the behaviours that make
# rendering new messages on their own wrong, so the tests exercise them on a real model.
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
CHAT_TEMPLATE = (
    # Text goes in {{ '...' }}: transformers renders with trim_blocks, which would eat a
    # newline written straight after a {% tag %}.
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] %}{% set rest = messages[1:] %}"
    "{% else %}"
    "{% set system = '" + DEFAULT_SYSTEM_PROMPT + "' %}{% set rest = messages %}"
    "{% endif %}"
    "{{ '<|im_start|>system\\n' + system }}"
    "{% if tools %}{{ '\\n\\n# Tools\\n\\nYou may call functions. Their signatures:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nCall one with <tool_call>\\n"
    '{"name": <name>, "arguments": <object>}'
    "\\n</tool_call>' }}{% endif %}{{ '<|im_end|>\\n' }}"
    "{% for m in rest %}"
    "{% if m['role'] == 'tool' %}"
    "{% if loop.first or rest[loop.index0 - 1]['role'] != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or rest[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% elif m['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' + (m['content'] or '') }}"
    "{% for call in m.get('tool_calls') or [] %}"
    "{% if m['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "{% set args = call['function']['arguments'] %}"
    "{{ '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    "{{ args if args is string else args | tojson }}{{ '}\\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tiny_tokenizer(vocab_size: int = 512) -> Any:
    """The tiny model's tokenizer (a ``PreTrainedTokenizerFast``), trained here in a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - optional extra

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
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_tiny_model(path: Path, *, vocab_size: int = 512, layers: int = 2, seed: int = 0) -> Path:
    """Write the model and tokenizer into ``path`` (created); return it."""
    import torch  # noqa: PLC0415 - optional extra
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    path.mkdir(parents=True, exist_ok=True)
    fast = tiny_tokenizer(vocab_size)
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
