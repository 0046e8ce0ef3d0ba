# The paper's training recipe (official scripts; SPEC.md "Training recipe"), shared by the full-scale configs,
# which run it first. SlimPajama-627B sampled with fixed domain weights, GPT-2 BPE (the paper: GPT-NeoX's),
# sequences of 2048 tokens, 1024 sequences = 2,097,152 tokens per step, 10,000 steps = ~20B tokens.
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
