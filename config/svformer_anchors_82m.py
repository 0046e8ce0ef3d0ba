# ICLR Sec. 4.8, Fig. 17 (sources: docs/experiments.md): SVFormer whose shared values are refreshed by
# "anchor" layers, at 82M (8 layers, 8 heads, d 512; the text gives no size: ours), paper_recipe.py's recipe.
# An anchor keeps its own W_V and values; the SVFormer layers above it, up to the next anchor, attend over the
# newest anchor's values instead of V1 (our reading: the text does not say how a layer picks its anchor).
# Fig. 17's legend: shared value from the first layer; first + last; first + one middle + last; first + two
# middle + last. The text does not place the middle anchors: ours, about evenly spaced over 8 layers, are
# layer 5 (one middle) and layers 4 and 6 (two middle), with layer 8 the last, which no layer above reads: it
# only gets its own values back (--anchors takes 1-based layer numbers; layer 1 always is one). Paper (curves
# only): "increasing the number of 'anchors' improves performance". The Transformer and SVFormer runs are
# shared_qk_82m.py's. Keep the quotes in the shell. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_anchors_82m.py --variant=vanilla --out_dir=out/sec4.8_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_anchors_82m.py --out_dir=out/sec4.8_svformer
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_anchors_82m.py --anchors='[8]' --out_dir=out/sec4.8_anchors_first_last
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_anchors_82m.py --anchors='[5,8]' --out_dir=out/sec4.8_anchors_first_middle_last
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_anchors_82m.py --anchors='[4,6,8]' --out_dir=out/sec4.8_anchors_first_two_middle_last
# The relative training loss (Fig. 17's curves: each run's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/sec4.8_vanilla out/sec4.8_svformer out/sec4.8_anchors_first_last out/sec4.8_anchors_first_middle_last out/sec4.8_anchors_first_two_middle_last
# CPU counterpart (8 layers, d 128, character-level Shakespeare, 3 seeds, the same anchors;
# results/anchors/README.md):
#   python lab/reproduce.py anchors
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
# Each anchor takes back a W_V: up to 3 x 0.26M parameters, under 0.1 GB more.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.8_svformer'
variant = 'svformer'
n_layer = 8
n_head = 8
n_embd = 512
