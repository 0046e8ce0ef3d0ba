# The paper's training recipe (its official training scripts), shared by the full-scale configs, which run it
# first: Llama-style models trained on SlimPajama-627B sampled with fixed domain weights (CommonCrawl 0.5, C4 0.2,
# GitHub 0.1, Books/ArXiv/Wikipedia/StackExchange 0.05 each), GPT-2 BPE here (the paper: GPT-NeoX's), sequences of
# 2048 tokens, 1024 sequences = 2,097,152 tokens per step, 10,000 steps = ~20B tokens; AdamW (0.9, 0.95), weight
# decay 0.1, linear warmup over 120 steps to 6e-4 then cosine to 6e-5, gradient clipping at 1.0, bf16; validation
# every 1000 steps, the mean over the 7 domains.
# Prepare the data first: python prepare.py --dataset=slimpajama   (needs `pip install datasets` and the network)
dataset = 'slimpajama_gpt2'
block_size = 2048
batch_size = 32  # per rank and micro-step; lower it to fit memory, the global batch stays 1024 sequences
gradient_accumulation_steps = 32  # summed over ranks: 8 GPUs x 4 micro-steps x 32 sequences = 1024
max_iters = 10000
lr_decay_iters = 10000
warmup_iters = 120
learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
eval_interval = 1000
eval_iters = 50  # 50 x 32 x 2048 = 3.3M validation tokens, the same windows at every evaluation
log_interval = 10
