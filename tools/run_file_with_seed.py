#!/usr/bin/env python3
"""Writes a copy of a k3cpp run file with its "seed" set and its "model" path made absolute
(the copy is read from another directory), atomically. Used by the long-context scripts.
usage: tools/run_file_with_seed.py SRC.json DST.json SEED"""
import json
import os
import sys

if len(sys.argv) != 4:
    sys.exit(__doc__)
src, dst, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
j = json.load(open(src))
j["seed"] = seed
j["model"] = os.path.abspath(os.path.join(os.path.dirname(src), j["model"]))
with open(dst + ".tmp", "w") as f:
    json.dump(j, f, indent=1)
os.replace(dst + ".tmp", dst)
