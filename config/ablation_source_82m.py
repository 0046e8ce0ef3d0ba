# Whose values a layer mixes in, at 82M (8 layers, 8 heads, d 512), paper_recipe.py's recipe (sources:
# docs/experiments.md), each with Identity's weights (0.5, 0.5) unless learned:
#   residual_from='first'     V'_n = 0.5 V1 + 0.5 V_n: ResFormer, the paper's (the default)
#   residual_from='adjacent'  V'_n = 0.5 V_{n-1} + 0.5 V_n, V_{n-1} the previous layer's own values
#   residual_from='previous'  V'_n = 0.5 mean(V_1 .. V_{n-1}) + 0.5 V_n
#   residual_from='second'    V'_n = 0.5 V2 + 0.5 V_n in layers 3-8 (layers 1 and 2 unchanged)
#   residual_from='dense'     Dense-ResFormer: V'_n = sum_{i<=n} w_{n,i} V_i, the weights learned, started at
#                             Identity's (w_{n,1} = w_{n,n} = 0.5, the others 0: ours)
#   h0_residual=False         block 1's attention sublayer does not add its input H0, so V2 cannot reach H0's
#                             information through the hidden stream
# Paper: ICLR Sec. 4.3, Fig. 11 (first, adjacent, all previous layers; curves only): "each Transformer layer
# should add a shortcut to the first layer's value rather than to the nearest preceding layer or all previous
# layers". Its forms are not written: ½ A_n (V_n + V_{n-1}) and a mean with equal weights (as Eqn. 5) are our
# reading. The latest version (second-hand) adds V2 as the source: V1, not V2, helps, but "when the residual
# connection from H_0 to H_1 is removed ... the skip connection from V_2 begins to provide a significant gain"
# (which path is removed is not said: dropping the attention sublayer's add is our reading), while the
# summary's own sentence is "Connections from V2 provide little benefit when residuals begin from H0 or H1":
# the runs test the first reading (a larger gain without H0) and can agree with the second; and
# Dense-ResFormer, V_n = λ_{n,n} H_{n-1} W_V + sum_{i<n} λ_{n,i} V_i (whether its λ are learned, and from
# what, is not said). No numbers are published for any of these runs. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=vanilla --out_dir=out/sec4.4_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --out_dir=out/sec4.4_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --residual_from=adjacent --out_dir=out/sec4.3_from_adjacent
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --residual_from=previous --out_dir=out/sec4.3_from_previous
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --residual_from=dense --out_dir=out/dense_resformer
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --residual_from=second --out_dir=out/sec4.4_identity_from_v2
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_learnable_plus --residual_from=second --out_dir=out/sec4.4_plus_from_v2
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=vanilla --h0_residual=False --out_dir=out/sec4.4_vanilla_no_h0
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --residual_from=second --h0_residual=False --out_dir=out/sec4.4_identity_from_v2_no_h0
# The relative training loss (each run's smoothed training loss minus its Transformer's; the runs without
# block 1's residual from H0 against the Transformer without it):
#   python lab/relative_loss.py out/sec4.4_vanilla out/sec4.4_resformer_identity out/sec4.3_from_adjacent out/sec4.3_from_previous out/dense_resformer out/sec4.4_identity_from_v2 out/sec4.4_plus_from_v2
#   python lab/relative_loss.py out/sec4.4_vanilla_no_h0 out/sec4.4_identity_from_v2_no_h0
# CPU counterpart (8 layers, d 128, character-level Shakespeare, 3 seeds: first, adjacent, previous, second,
# dense, and second without H0 against the Transformer without H0; results/source/README.md):
#   python lab/reproduce.py source
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.4_resformer_identity'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
