# Where V1 goes, at 82M (8 layers, 8 heads, d 512), paper_recipe.py's recipe (sources: docs/experiments.md):
# the latest version's single-layer placements and widening (second-hand; its table number is unknown to us):
# "applying the Value residual solely on layer 7 yields the best single-layer performance; expanding it to
# layers 6-8 achieves the optimal overall effect, while benefits diminish when extending from layer 5
# onwards". Its λ, its exact grid and its numbers are not known: each run puts Sparse's λ = (5, 1) (the only
# published sparse weights, second-hand) on layer 7 alone, or on layers 7-8, 6-8 (= the Sparse variant), 5-8
# or 4-8, and (0, 1) on the rest. λ rows are (weight on V1, weight on V_n), one per layer 1-8; keep the quotes
# in the shell. Compare with ablation_lambdas_82m.py's Transformer and Sparse runs. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[0,1],[5,1],[0,1]]' --out_dir=out/placement_layer7
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[0,1],[5,1],[5,1]]' --out_dir=out/placement_layers7-8
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[5,1],[5,1],[5,1]]' --out_dir=out/placement_layers6-8
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[5,1],[5,1],[5,1],[5,1]]' --out_dir=out/placement_layers5-8
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_placement_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[5,1],[5,1],[5,1],[5,1],[5,1]]' --out_dir=out/placement_layers4-8
# Memory: about 56 GB eager, 19 GB compiled per GPU at 32 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/placement_layer7'
variant = 'custom'
value_residual = True
lambdas = [[0, 1], [0, 1], [0, 1], [0, 1], [0, 1], [0, 1], [5, 1], [0, 1]]  # λ = (5, 1) on layer 7 alone
n_layer = 8
n_head = 8
n_embd = 512
