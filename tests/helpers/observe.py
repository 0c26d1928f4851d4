"""A script that writes down what a script can see of how it was started, then exits with
``OBSERVE_EXIT`` (3 by default) without reporting (``tests/scriptmode/test_prewarm.py``)."""

import atexit
import json
import os
import random
import subprocess
import sys

import torch
from torch.utils.data import DataLoader

out = os.environ["OBSERVE_OUT"]
facts = {
    "argv": sys.argv, "name": __name__, "file": __file__, "cwd": os.getcwd(), "path0": sys.path[0],
    "env": os.environ.get("OBSERVE_ENV"), "threads": torch.get_num_threads(), "random": random.random(),
    "subprocess": subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, check=True).stdout.decode(),
    "stdin": sys.stdin.read(), "world": os.environ.get("WORLD_SIZE"), "trial": "TUNER_TRIAL" in os.environ,
    "workers": sorted(int(v) for batch in DataLoader(list(range(4)), batch_size=2, num_workers=2) for v in batch),
    "torch_seed": torch.initial_seed(), "cuda_initialized": torch.cuda.is_initialized(),
}
atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
with open(out, "w") as f:
    json.dump(facts, f)
print("observed", flush=True)
if os.environ.get("OBSERVE_EXIT") == "raise":
    raise ValueError("observe: the script's own error")
sys.exit(int(os.environ.get("OBSERVE_EXIT", "3")))
