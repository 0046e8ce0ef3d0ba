# Where V1 goes, and post-residual rescaling, at 82M (8 layers, 8 heads, d 512), paper_recipe.py's recipe
# (sources: docs/experiments.md). The latest version's single-layer placements and widening (second-hand; its
# table number is unknown to us): "applying the Value residual solely on layer 7 yields the best single-layer
# performance; expanding it to layers 6-8 achieves the optimal overall effect, while benefits diminish when
# extending from layer 5 onwards"; the summary also says "later-layer-only connections can degrade
# performance". The latest version's Table 10 (second-hand: we could not read it) crosses sparse placement
# with λ and post-residual rescaling: "post-residual rescaling benefits shallow-sparse variants more than
# deep-sparse variants" ("shallow/deep" may mean the network's depth; we test placement in one 8-layer
# network). Its λ, grids, rescaling formula and numbers are not known: each run
# puts Sparse's λ = (5, 1) (the only published sparse weights, second-hand) on layer 7 alone, on layers 7-8,
# 6-8 (= the Sparse variant), 5-8 or 4-8, or on the shallow layers 2-4, and (0, 1) on the rest; rescaling
# (--value_rescale=True) divides the mixed values by λ1 + λ2, V'_n = (5 V1 + V_n) / 6 (our form), on layers
# 2-4 (shallow) and 6-8 (deep). λ rows are (weight on V1, weight on V_n), one per layer 1-8; keep the quotes in
# the shell. Compare with ablation_lambdas_82m.py's Transformer and Sparse runs. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[0,1],[5,1],[0,1]]' --out_dir=out/placement_layer7
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[0,1],[5,1],[5,1]]' --out_dir=out/placement_layers7-8
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[5,1],[5,1],[5,1]]' --out_dir=out/placement_layers6-8
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[5,1],[5,1],[5,1],[5,1]]' --out_dir=out/placement_layers5-8
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[5,1],[5,1],[5,1],[5,1],[5,1]]' --out_dir=out/placement_layers4-8
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[5,1],[5,1],[5,1],[0,1],[0,1],[0,1],[0,1]]' --out_dir=out/placement_layers2-4
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[5,1],[5,1],[5,1],[0,1],[0,1],[0,1],[0,1]]' --value_rescale=True --out_dir=out/placement_layers2-4_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[5,1],[5,1],[5,1]]' --value_rescale=True --out_dir=out/placement_layers6-8_rescaled
# The relative training loss (each run's smoothed training loss minus ablation_lambdas_82m.py's Transformer's):
#   python lab/relative_loss.py out/sec4.4_vanilla out/placement_layer7 out/placement_layers7-8 out/placement_layers6-8 out/placement_layers5-8 out/placement_layers4-8
#   python lab/relative_loss.py out/sec4.4_vanilla out/placement_layers2-4 out/placement_layers2-4_rescaled out/placement_layers6-8 out/placement_layers6-8_rescaled
# CPU counterpart (8 layers, d 128, character-level Shakespeare, 3 seeds: layer 7, 7-8, 6-8, 5-8, 4-8, 2-4,
# and 2-4 and 6-8 rescaled; results/placement/README.md):
#   python lab/reproduce.py placement
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/placement_layer7'
variant = 'custom'
value_residual = True
lambdas = [[0, 1], [0, 1], [0, 1], [0, 1], [0, 1], [0, 1], [5, 1], [0, 1]]  # λ = (5, 1) on layer 7 alone
n_layer = 8
n_head = 8
n_embd = 512
