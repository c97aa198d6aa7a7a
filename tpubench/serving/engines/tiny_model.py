"""A tiny Llama with random weights and a tokenizer, both built here: the test engine's model.

``transformers serve`` needs a model folder; downloading one is not possible on every host
(nor wanted in a test). :func:`build` trains a byte-level BPE tokenizer on a few lines,
wraps it as a ``PreTrainedTokenizerFast`` with a chat template, and saves it beside a
2-layer Llama with random weights, all with ``save_pretrained``: nothing is fetched. The
end-of-sequence token's output row is zeroed, so greedy decoding (random logits around it)
never picks it: every request generates exactly ``max_tokens``, as ``ignore_eos`` would
make it, for engines that do not honour that field.

    python -m tpubench.serving.engines.tiny_model /tmp/tiny-llama
    tpubench serving --engine transformers --model /tmp/tiny-llama --engine-arg=--device=cpu ...
"""

from __future__ import annotations

import sys
from pathlib import Path

#: the lines the tokenizer is trained on
LINES = (
    "The quick brown fox jumps over the lazy dog.",
    "A tiny model with random weights serves tokens for the benchmark's tests.",
    "Serving engines are measured under load: time to first token, time per output token.",
    "Hello world! 0123456789, requests per second and tokens per second per dollar.",
)
VOCAB_SIZE = 384
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build(directory: str | Path, *, seed: int = 0, max_positions: int = 4096) -> Path:
    """Save the tokenizer and model to ``directory`` (created) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory = Path(directory)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(LINES, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight[fast.eos_token_id].zero_()
    model.save_pretrained(directory)
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tpubench.serving.engines.tiny_model DIRECTORY")
    print(build(sys.argv[1]))
