# The value residual's weights at 82M (8 layers, 8 heads, d 512), paper_recipe.py's recipe (sources:
# docs/experiments.md). λ rows are (weight on V1, weight on V_n), one per layer; keep the quotes in the shell.
# - The latest version's named variants (second-hand): Identity (0.5, 0.5), Constant (λ1 = 2, λ2 = 1), Sparse
#   (layers 6-8 only, λ1 = 5), Learnable (from 0.5, 0.5) and Learnable-Plus (λ1 = λ softmax(λ'); our start for
#   λ'). Mean validation loss: Transformer 2.7389, Identity 2.7117 (ICLR A.6 Table 5); Constant 2.700, Sparse
#   2.687, Learnable-Plus 2.681 (second-hand; no Learnable number is known); learned λ on V1 grow with depth
#   (second-hand). Single layers and wider ranges for V1: ablation_placement_82m.py.
# - ICLR Sec. 4.2, Fig. 8: U_n = A_n (V_n + λ V1) in layers 2-8 for λ = 0.2, 0.5, 0.8, 1, 2 and 5 (λ = 2 is
#   Constant above). Curves only: every λ beats the Transformer, λ = 2 is best. The text gives no model size
#   for it: 82M, our choice.
# Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=vanilla --out_dir=out/sec4.4_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_identity --out_dir=out/sec4.4_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_constant --out_dir=out/sec4.4_resformer_constant
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_learnable --out_dir=out/sec4.4_resformer_learnable
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_learnable_plus --out_dir=out/sec4.4_resformer_learnable_plus
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_sparse --out_dir=out/sec4.4_resformer_sparse
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0.2,1],[0.2,1],[0.2,1],[0.2,1],[0.2,1],[0.2,1],[0.2,1]]' --out_dir=out/sec4.2_lambda0.2
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0.5,1],[0.5,1],[0.5,1],[0.5,1],[0.5,1],[0.5,1],[0.5,1]]' --out_dir=out/sec4.2_lambda0.5
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0.8,1],[0.8,1],[0.8,1],[0.8,1],[0.8,1],[0.8,1],[0.8,1]]' --out_dir=out/sec4.2_lambda0.8
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[1,1],[1,1],[1,1],[1,1],[1,1],[1,1],[1,1]]' --out_dir=out/sec4.2_lambda1
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[5,1],[5,1],[5,1],[5,1],[5,1],[5,1],[5,1]]' --out_dir=out/sec4.2_lambda5
# The relative training loss (the paper's curves: each run's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/sec4.4_vanilla out/sec4.4_resformer_identity out/sec4.4_resformer_constant out/sec4.4_resformer_sparse out/sec4.4_resformer_learnable out/sec4.4_resformer_learnable_plus
#   python lab/relative_loss.py out/sec4.4_vanilla out/sec4.2_lambda0.2 out/sec4.2_lambda0.5 out/sec4.2_lambda0.8 out/sec4.2_lambda1 out/sec4.4_resformer_constant out/sec4.2_lambda5
# CPU counterparts (character-level Shakespeare, 3 seeds; the tables in results/<suite>/README.md): Fig. 8's
# λ sweep at 4 layers, and the named variants at 4 and at 8 layers:
#   python lab/reproduce.py lambdas
#   python lab/reproduce.py variants
#   python lab/reproduce.py depth
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.4_resformer_sparse'
variant = 'resformer_sparse'
n_layer = 8
n_head = 8
n_embd = 512
