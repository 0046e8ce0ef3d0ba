# The paper's residual-type ablation (82M, 8 layers: Transformer 2.739, Identity 2.712, Learnable 2.705,
# Constant 2.700, Sparse 2.687, Learnable-Plus 2.681; SPEC.md) shrunk to run on a CPU: 8 layers, so the
# sparse preset lands on layers 6-8 as in the paper. Run each variant into its own folder, then compare
# the val_loss lines of their log.jsonl (and run analyze.py on the folders):
#   for v in vanilla resformer_identity resformer_learnable resformer_constant resformer_sparse \
#            resformer_learnable_plus svformer neutreno denseformer; do
#     python train.py config/small_ablation.py --variant=$v --out_dir=out/ablation_$v
#   done
# Prepare the data first: python prepare.py
dataset = 'shakespeare_char'
variant = 'resformer_identity'
n_layer = 8
n_head = 4
n_embd = 128
block_size = 128
batch_size = 16
max_iters = 1000
lr_decay_iters = 1000
warmup_iters = 50
learning_rate = 2e-3
min_lr = 2e-4
eval_interval = 200
eval_iters = 20
