# Transformer vs ResFormer at ~1.6B. The paper's 1.6B shape is not published in what we found: 24 layers,
# d 2048, 16 heads, SwiGLU 7168 gives 1.67B parameters (with our 50304 vocab), so this shape is INFERRED, not the paper's.
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_1b6.py [--variant=vanilla --out_dir=out/vanilla_1b6]
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/resformer_1b6'
variant = 'resformer_identity'
n_layer = 24
n_head = 16
n_embd = 2048  # SwiGLU hidden defaults to 3.5 x n_embd = 7168
batch_size = 8  # per rank; with gradient_accumulation_steps = 128 the global batch stays 1024 sequences
gradient_accumulation_steps = 128
