# Transformer vs ResFormer at 180M: the paper's model-size comparison (mean val loss; SPEC.md "Headline results").
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_180m.py
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_180m.py --variant=vanilla --out_dir=out/vanilla_180m
# Any other variant (resformer_learnable_plus, svformer, ...) the same way.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/resformer_180m'
variant = 'resformer_identity'
n_layer = 12
n_head = 12
n_embd = 768  # SwiGLU hidden defaults to 3.5 x n_embd = 2688
