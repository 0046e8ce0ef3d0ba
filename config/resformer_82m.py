# Transformer vs ResFormer at 82M: the paper's model-size comparison (mean val loss; SPEC.md "Headline results").
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py --variant=vanilla --out_dir=out/vanilla_82m
# Any other variant (resformer_learnable_plus, svformer, ...) the same way.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/resformer_82m'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512  # SwiGLU hidden defaults to 3.5 x n_embd = 1792
