# The README's main job, spelled out: a small ResFormer on character-level Shakespeare, minutes on a laptop CPU.
# These are train.py's defaults; copy this file to change them. Compare variants at the same settings with e.g.
#   python train.py config/shakespeare_char.py --variant=vanilla --out_dir=out/vanilla
#   python train.py config/shakespeare_char.py --variant=svformer --out_dir=out/svformer
# Prepare the data first: python prepare.py
out_dir = 'out'
dataset = 'shakespeare_char'
variant = 'resformer_identity'
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 16
max_iters = 600
lr_decay_iters = 600
warmup_iters = 50
learning_rate = 2e-3
min_lr = 2e-4
eval_interval = 100
eval_iters = 10
