#!/usr/bin/env bash
# The GPU checks of issues 24 and 27 §2, in one call of a lent CUDA machine (about 8 min on
# an H200): the CUDA-graph equivalence tests, runs trained on the GPU re-executed on the CPU
# (issue 24's Done-when), the cube step against its §5 targets, where
# the step's GPU time goes, and the ASL steady state at batch 128. Runs under the machine's
# own python3 (torch, numpy, pyarrow, safetensors; no Django needed). Each part is written to
# $OUT (or ./var/device-check) as it finishes.
set -u
out="${OUT:-var/device-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
nvidia-smi -L
"$py" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
timeout 90 "$py" -m pytest -o addopts="" --noconftest -p no:cacheprovider -p no:django -q \
    tests/training/test_cube_graphed.py tests/training/test_asl_dropout.py 2>&1 | tail -20 | tee "$out/tests.txt"
# Issue 24's Done-when: honest runs trained on the GPU re-executed on the CPU, as the platform does.
timeout 200 "$py" bench/cross_device.py --train-device cuda 2>&1 | tail -8 | tee "$out/cross-device.txt"
timeout 120 "$py" bench/cube.py --device cuda --reference-batch 0 --repeats 20 2>&1 | tee "$out/cube.txt"
timeout 60 "$py" bench/cube.py --device cuda --reference-batch 0 --edges 37 --activation-checkpointing off \
    2>&1 | tee "$out/cube37-no-checkpointing.txt"
timeout 100 "$py" bench/cube_profile.py 2>&1 | tee "$out/cube-profile.txt"
timeout 150 "$py" bench/asl.py --device cuda --batch 128 --sequences 800 --repeat 16 --epochs 3 --rounds 1 \
    --threads 4 --repeats 1 2>&1 | tee "$out/asl.txt"
