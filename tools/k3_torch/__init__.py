"""k3_torch: an independent plain-PyTorch implementation of the Kimi K3 model.

Written from docs/model.md sections 2-6 and pinned by the fixtures in
tests/data/k3-fixtures/ops (see selftest.py), not translated from k3cpp's C++, so that k3cpp's
forward logits and gradients can be checked against something other than itself.

Modules: safetensors_io (read/write safetensors, MXFP4 decode), config (config.json in the
Hugging Face nested or the flat fixture form), ops (the K3 ops, batch-first), model (the stack:
forward, loss), checkpoint (load a k3cpp / released model directory), selftest (fixtures).
Needs only torch and the standard library (numpy is not required).
"""
