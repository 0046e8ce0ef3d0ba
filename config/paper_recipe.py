# The paper's training recipe (its official training scripts), shared by the full-scale configs, which run it
# first: Llama-style models trained on SlimPajama-627B sampled with fixed domain weights (CommonCrawl 0.5, C4 0.2,
# GitHub 0.1, Books/ArXiv/Wikipedia/StackExchange 0.05 each), GPT-2 BPE here (the paper: GPT-NeoX's), sequences of
# 2048 tokens, 1024 sequences = 2,097,152 tokens per step, 10,000 steps = ~20B tokens; AdamW (0.9, 0.95), weight
# decay 0.1, linear warmup over 120 steps to 6e-4 then cosine to 6e-5, gradient clipping at 1.0, bf16; validation
# every 1000 steps, the mean over the 7 domains.
# Prepare the data first: python prepare.py --dataset=slimpajama   (needs `pip install datasets` and the network),
# or from SlimPajama downloaded to DIR (its train/ and validation/ folders): python prepare.py --dataset=slimpajama --input=DIR
# Memory per GPU, as each config's header states it: an estimate, not measured on a GPU. Tensors saved for backward
# (bf16 autocast, eager) were counted with torch.autograd.graph.saved_tensors_hooks on a CPU at micro-batch 1, 256 and
# 512 tokens, 2 and 3 layers of each shape, and scaled linearly to its layers and micro-batch x 2048 tokens; to them
# come 16 bytes per parameter (fp32 weights, fp32 gradients, which DDP's buckets hold as views, AdamW's two moments)
# and the fp32 gradient of the logits, then up to a third more for what that count misses (it gives 45 GB for the 82M model at
# 32 x 2048, where the eager peak was found at 55-60 GB). torch.compile, on by default on CUDA, needs less (82M: 25-40 GB).
dataset = 'slimpajama_gpt2'
block_size = 2048
batch_size = 32  # x gradient_accumulation_steps = the global batch of 1024 sequences, on any number of ranks
gradient_accumulation_steps = 32  # 1024 sequences = 8 GPUs x 128 each, in micro-batches of micro_batch_size
micro_batch_size = 32  # per GPU and forward pass (4 micro-steps on 8 GPUs): fits the 82M model in 80 GB (about
# 45-60 GB); the larger configs lower it. Lower it further to fit memory: the step (its batch and result) is unchanged
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
