# Which attention matrix maps the values of earlier layers, at 82M (8 layers, 8 heads, d 512),
# paper_recipe.py's recipe (sources: docs/experiments.md):
#   current   U_n = A_n (0.5 V1 + 0.5 V_n)            ResFormer: V1 read through the current layer's attention
#   first     U_n = 0.5 A_1 V1 + 0.5 A_n V_n          layer 1's own attention output U_1 mixed in before W_O
#   identity  U_n = A_n V_n + 1/(n-1) sum_{i<n} V_i   every earlier layer's values, without attention
# ICLR Sec. 4.3, Fig. 10 compares ResFormer with cross-layer attention (Eqn. 2, not built) and the identity
# mapping (Eqn. 6, as above; no λ): it "causes significant perturbations, leading to poor performance".
# No source we could read has the mapping by layer 1's attention. Paper: Transformer 2.7389, ResFormer 2.7117
# (ICLR A.6 Table 5); Fig. 10 has curves only. The CPU `controls` suite (reproduce.py) runs the identity
# mapping at the 8-layer CPU scale. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=vanilla --out_dir=out/sec4.4_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=resformer_identity --out_dir=out/sec4.4_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=resformer_identity --value_mapping=first --out_dir=out/sec4.4_mapping_first
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=resformer_identity --value_mapping=identity --out_dir=out/sec4.4_mapping_identity
# Memory: about 56 GB eager, 19 GB compiled per GPU at 32 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.4_resformer_identity'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
