# The paper's KV-cache study (SVFormer vs GQA vs CLA, ICLR Sec. 4.6; full size: svformer_82m.py) shrunk to a
# CPU, on GPT-2 BPE Shakespeare. Each line keeps the model shape and the tokens per step; sample.py prints
# each one's KV cache size:
#   python train.py config/small_svformer.py --variant=vanilla  --out_dir=out/kv_vanilla
#   python train.py config/small_svformer.py --variant=svformer --out_dir=out/kv_svformer
#   python train.py config/small_svformer.py --variant=custom --n_kv_head=2 --out_dir=out/kv_gqa
#   python train.py config/small_svformer.py --variant=cla      --out_dir=out/kv_cla
#   python train.py config/small_svformer.py --variant=svformer --n_kv_head=2 --out_dir=out/kv_svformer_gqa
# The paper varies the sequence length at a fixed token batch: e.g. --block_size=256 --batch_size=4.
# Prepare the data first: python prepare.py --tokenizer=gpt2
dataset = 'shakespeare_gpt2'
variant = 'svformer'
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 8
max_iters = 300
lr_decay_iters = 300
warmup_iters = 30
learning_rate = 2e-3
min_lr = 2e-4
eval_interval = 100
eval_iters = 10
