# The value-residual variants and baselines at the paper's depth, shrunk to run on a CPU: 8 layers, so the
# sparse preset lands on layers 6-8 as in the paper. The paper's 82M numbers (mean validation loss):
# Transformer 2.739 and Identity 2.712 (ICLR A.6 Table 5), Constant 2.700, Sparse 2.687, Learnable-Plus 2.681
# (the latest version, second-hand); ablation_lambdas_82m.py runs them at full size. Run each variant into its
# own folder, then compare the val_loss lines of their log.jsonl (and run analyze.py on the folders):
#   python train.py config/small_ablation.py --variant=vanilla --out_dir=out/ablation_vanilla
#   python train.py config/small_ablation.py --variant=resformer_identity --out_dir=out/ablation_resformer_identity
#   python train.py config/small_ablation.py --variant=resformer_learnable --out_dir=out/ablation_resformer_learnable
#   python train.py config/small_ablation.py --variant=resformer_constant --out_dir=out/ablation_resformer_constant
#   python train.py config/small_ablation.py --variant=resformer_sparse --out_dir=out/ablation_resformer_sparse
#   python train.py config/small_ablation.py --variant=resformer_learnable_plus --out_dir=out/ablation_resformer_learnable_plus
#   python train.py config/small_ablation.py --variant=svformer --out_dir=out/ablation_svformer
#   python train.py config/small_ablation.py --variant=neutreno --out_dir=out/ablation_neutreno
#   python train.py config/small_ablation.py --variant=denseformer --out_dir=out/ablation_denseformer
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
