"""``python -m specviz``: the command line (:mod:`specviz.cli`)."""
import os
import sys

# PyTorch's OpenMP workers spin while waiting by default; on a small shared CPU (the 2-core
# machines this runs on, with a browser and a server beside it) that turns a 0.2 s round into
# seconds. Passive waiting keeps rounds fast. Must happen before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# ... but sleeping at once between two linears of one forward costs a thread wake-up per call:
# with torch's libgomp a short bounded spin (~0.4 ms; GOMP_SPINCOUNT overrides the policy's
# zero) keeps the workers awake through a forward and still yields between rounds. Measured on
# the 2-core AMD machine (embedded model, packed linears): one-token step 65 -> 47 ms, an
# 8-token verify 88 -> 69 ms; 2,000 spins: 54 ms; with a busy process beside it no slower.
os.environ.setdefault("GOMP_SPINCOUNT", "20000")

from .cli import main  # noqa: E402  (after the OpenMP settings: the CLI imports torch)

sys.exit(main())
