# Sec. 4.4: which attention matrix maps V1, at 82M (8 layers, 8 heads, d 512), Identity weights (0.5, 0.5):
#   current  U_n = A_n (0.5 V1 + 0.5 V_n)           (ResFormer: V1 is read through the current layer's attention)
#   first    U_n = 0.5 A_1 V1 + 0.5 A_n V_n          (layer 1's own attention output U_1 mixed in before W_O)
# Paper: mapping V1 with the current layer's attention is what helps (Identity ResFormer 2.712 against the
# Transformer's 2.739); the mapping-by-layer-1 variant's loss is not restated here. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=vanilla --out_dir=out/sec4.4_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=resformer_identity --out_dir=out/sec4.4_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_mapping_82m.py --variant=resformer_identity --value_mapping=first --out_dir=out/sec4.4_mapping_first
# Memory: micro_batch_size = 32 sequences of 2048 tokens per GPU, about 45-60 GB (paper_recipe.py says how estimated).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.4_resformer_identity'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
