# Sourced by the resnet50 pruning benchmarks (channel_prune.sh, block_prune.sh), in their work
# folder with $here and $idx set: writes Fashion-MNIST as an image folder (fm/, once) and the
# dense run's spec (dense.textproto), and sets $data, the spec blocks every run shares: 224 px,
# bf16, batch 256, 2 epochs of SGD with Nesterov momentum and a cosine schedule, on CUDA.
[ -d fm ] || python3 "$here/fashion_folder.py" "$idx" fm
data='data { dataset: IMAGE_FOLDER path: "fm" batch_size: 256 augment { horizontal_flip: true }
       image_folder { image_size: 224 channels: 1 } }
train { epochs: 2 precision: BF16 optimizer { lr: 0.2 momentum: 0.9 nesterov: true weight_decay: 5e-5 }
        lr_schedule { kind: COSINE } }
device { kind: CUDA }'
printf 'name: "fm224_resnet50_dense"\nseed: 5\nmodel { arch: "resnet50" }\n%s\n' "$data" > dense.textproto
