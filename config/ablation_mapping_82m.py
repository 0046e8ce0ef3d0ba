# Which attention matrix maps the values of earlier layers, at 82M (8 layers, 8 heads, d 512),
# paper_recipe.py's recipe (sources: docs/experiments.md):
#   current   U_n = A_n (0.5 V1 + 0.5 V_n)            ResFormer (ICLR Eqn. 7): V1 read through A_n
#   cross     U_n = softmax(Q_n [K_n; K_1]^T) [V_n; V_1]   cross-layer attention (ICLR Eqn. 2, m = 1): one
#             softmax over the layer's own keys and layer 1's, concatenated along the positions, each causal
#             (ours: the paper gives no mask); attention over 2T keys, so about twice attention's cost
#   first     U_n = 0.5 A_1 V1 + 0.5 A_n V_n          layer 1's own attention output U_1 mixed in before W_O
#   identity  U_n = A_n V_n + 1/(n-1) sum_{i<n} V_i   every earlier layer's values, without attention (Eqn. 6)
# Paper: ICLR Sec. 4.3, Fig. 10 compares ResFormer with cross-layer attention and the identity mapping (no λ).
# We have only fragments of its two sentences, not the sentences whole: the identity mapping "causes
# significant perturbations, leading to poor performance", and a mapping the fragment does not name
# "achieves an even lower final loss than ResFormer". Read literally, another mapping (cross-layer attention,
# presumably, which ResFormer approximates) ends below ResFormer; the CPU run finds the reverse
# (docs/experiments.md). Curves only; no size is given: 82M, ours. No source we could read has the mapping by
# layer 1's attention (first: ours).
# Transformer 2.7389, ResFormer 2.7117 (ICLR A.6 Table 5). Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=vanilla --out_dir=out/sec4.4_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=resformer_identity --out_dir=out/sec4.4_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=resformer_identity --value_mapping=cross --out_dir=out/sec4.4_mapping_cross
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=resformer_identity --value_mapping=first --out_dir=out/sec4.4_mapping_first
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=resformer_identity --value_mapping=identity --out_dir=out/sec4.4_mapping_identity
# The relative training loss (each run's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/sec4.4_vanilla out/sec4.4_resformer_identity out/sec4.4_mapping_cross out/sec4.4_mapping_first out/sec4.4_mapping_identity
# CPU counterpart (8 layers, d 128, character-level Shakespeare, 3 seeds; results/mapping/README.md; the
# `controls` suite has the identity mapping too):
#   python lab/reproduce.py mapping
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.4_resformer_identity'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
