"""Build the tiny test model for scripts/real-vllm: a Llama with random weights and a
byte-level BPE tokenizer trained here, so no model hub is involved.

Shape (docs/real-vllm.md): hidden 128, 2 layers, 2 heads (head size 64, which the CPU
attention backend accepts), intermediate 256, 2048 positions; float32, about 2 MB.
`--max-positions N` gives the same model (same weights, same tokenizer) N positions: the long
variant (`scripts/real-vllm up --model long`) has 32768, for prefills of tens of thousands of
tokens.
Usage: make_model.py OUT_DIR [--max-positions N]
"""

import argparse
import os
import random

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--max-positions", type=int, default=2048)
args = parser.parse_args()
out = args.out
os.makedirs(out, exist_ok=True)

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

# A corpus made on the spot: numbers and a few words, enough for a few hundred merges.
rng = random.Random(1234)
words = "the a npu engine token cache probe health status normal abnormal prefill decode".split()
corpus = []
for _ in range(4000):
    n = rng.randint(3, 12)
    corpus.append(" ".join(rng.choice(words) if rng.random() < 0.6 else str(rng.randint(0, 999)) for _ in range(n)))

specials = ["<s>", "</s>", "<unk>", "<pad>"]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=800,
    special_tokens=specials,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tok.train_from_iterator(corpus, trainer=trainer)

fast = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    bos_token="<s>",
    eos_token="</s>",
    unk_token="<unk>",
    pad_token="<pad>",
)
# Chat routes need a template; a plain one is enough for a test model.
fast.chat_template = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
fast.save_pretrained(out)

vocab = len(fast)
config = LlamaConfig(
    vocab_size=vocab,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=args.max_positions,
    bos_token_id=fast.bos_token_id,
    eos_token_id=fast.eos_token_id,
    pad_token_id=fast.pad_token_id,
    tie_word_embeddings=False,
)
torch.manual_seed(1234)
model = LlamaForCausalLM(config).to(torch.float32)
model.save_pretrained(out, safe_serialization=True)
params = sum(p.numel() for p in model.parameters())
print(f"tiny model: vocab {vocab}, {params} parameters, {args.max_positions} positions, in {out}")
