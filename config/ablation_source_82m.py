# The value residual taken from layer 2's values V2 instead of V1, at 82M (8 layers, 8 heads, d 512),
# paper_recipe.py's recipe (sources: docs/experiments.md). residual_source=1 mixes V2 into layers 3-8 (layers
# 1 and 2 unchanged): V'_n = λ1 V2 + λ2 V_n. h0_residual=False drops block 1's residual connection from H0
# (its attention sublayer does not add its input), so V2 cannot reach H0's information through the hidden
# stream. Paper, the latest version (second-hand): V1, not V2, is the source that helps; "when the residual
# connection from H_0 to H_1 is removed ... the skip connection from V_2 begins to provide a significant gain"
# (which path is removed is not said: dropping the attention sublayer's add is our reading). No numbers are
# published for these runs; ICLR Sec. 4.3, Fig. 11 (values from the first, the adjacent or all previous
# layers) is the ICLR text's nearest study (not built: docs/experiments.md). Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=vanilla --out_dir=out/sec4.4_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --out_dir=out/sec4.4_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --residual_source=1 --out_dir=out/sec4.4_identity_from_v2
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_learnable_plus --residual_source=1 --out_dir=out/sec4.4_plus_from_v2
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=vanilla --h0_residual=False --out_dir=out/sec4.4_vanilla_no_h0
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --residual_source=1 --h0_residual=False --out_dir=out/sec4.4_identity_from_v2_no_h0
# Memory: about 56 GB eager, 19 GB compiled per GPU at 32 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.4_resformer_identity'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
