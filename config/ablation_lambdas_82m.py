# Sec. 4.4 and Table 10: which layers get V1, and how strongly, at 82M (8 layers, 8 heads, d 512).
# Paper (mean validation loss): Transformer 2.739, Identity (λ = 0.5, 0.5) 2.712, Learnable 2.705,
# Constant (λ1 = 2) 2.700, Sparse (layers 6-8, λ1 = 5) 2.687, Learnable-Plus 2.681. Learned λ favour later
# layers; sparse residuals on layers 6-8 are the best placement at 8 layers; post-residual rescaling,
# V'_n / (λ1 + λ2), helps the shallow sparse placements. Table 10's full grid is not restated here: the custom
# runs below put V1 on shallow (2-4), middle (4-6) or deep (6-8) layers at λ1 = 1, 2, 5 with λ2 = 1, each
# without and with rescaling (the Sparse preset is layers 6-8 at λ1 = 5; Identity and Constant cover all
# layers). λ rows are (weight on V1, weight on V_n), one per layer; keep the quotes in the shell. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=vanilla --out_dir=out/sec4.4_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_identity --out_dir=out/sec4.4_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_constant --out_dir=out/sec4.4_resformer_constant
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_learnable --out_dir=out/sec4.4_resformer_learnable
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_learnable_plus --out_dir=out/sec4.4_resformer_learnable_plus
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_sparse --out_dir=out/sec4.4_resformer_sparse
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=resformer_constant --value_rescale=True --out_dir=out/sec4.4_resformer_constant_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[1,1],[1,1],[1,1],[0,1],[0,1],[0,1],[0,1]]' --out_dir=out/sec4.4_sparse2-4_l1
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[1,1],[1,1],[1,1],[0,1],[0,1],[0,1],[0,1]]' --value_rescale=True --out_dir=out/sec4.4_sparse2-4_l1_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[2,1],[2,1],[2,1],[0,1],[0,1],[0,1],[0,1]]' --out_dir=out/sec4.4_sparse2-4_l2
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[2,1],[2,1],[2,1],[0,1],[0,1],[0,1],[0,1]]' --value_rescale=True --out_dir=out/sec4.4_sparse2-4_l2_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[5,1],[5,1],[5,1],[0,1],[0,1],[0,1],[0,1]]' --out_dir=out/sec4.4_sparse2-4_l5
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[5,1],[5,1],[5,1],[0,1],[0,1],[0,1],[0,1]]' --value_rescale=True --out_dir=out/sec4.4_sparse2-4_l5_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[1,1],[1,1],[1,1],[0,1],[0,1]]' --out_dir=out/sec4.4_sparse4-6_l1
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[1,1],[1,1],[1,1],[0,1],[0,1]]' --value_rescale=True --out_dir=out/sec4.4_sparse4-6_l1_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[2,1],[2,1],[2,1],[0,1],[0,1]]' --out_dir=out/sec4.4_sparse4-6_l2
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[2,1],[2,1],[2,1],[0,1],[0,1]]' --value_rescale=True --out_dir=out/sec4.4_sparse4-6_l2_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[5,1],[5,1],[5,1],[0,1],[0,1]]' --out_dir=out/sec4.4_sparse4-6_l5
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[5,1],[5,1],[5,1],[0,1],[0,1]]' --value_rescale=True --out_dir=out/sec4.4_sparse4-6_l5_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[1,1],[1,1],[1,1]]' --out_dir=out/sec4.4_sparse6-8_l1
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[1,1],[1,1],[1,1]]' --value_rescale=True --out_dir=out/sec4.4_sparse6-8_l1_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[2,1],[2,1],[2,1]]' --out_dir=out/sec4.4_sparse6-8_l2
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[2,1],[2,1],[2,1]]' --value_rescale=True --out_dir=out/sec4.4_sparse6-8_l2_rescaled
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_lambdas_82m.py --variant=custom --value_residual=True --lambdas='[[0,1],[0,1],[0,1],[0,1],[0,1],[5,1],[5,1],[5,1]]' --value_rescale=True --out_dir=out/sec4.4_sparse6-8_l5_rescaled
# Memory: micro_batch_size = 32 sequences of 2048 tokens per GPU, about 45-60 GB (paper_recipe.py says how estimated).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.4_resformer_sparse'
variant = 'resformer_sparse'
n_layer = 8
n_head = 8
n_embd = 512
