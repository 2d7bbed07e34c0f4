"""A stand-in for a stage's command (`python -m tests.warm_probe [--exit N] [--sleep S]`), run
by the warm server when it can take it, as `envace.stages.main` does: it prints where it ran."""

import json
import os
import sys
import time

from envace import warm_start

if __name__ == "__main__":
    status = warm_start.run_in_server()
    if status is not None:
        sys.exit(status)
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    print(json.dumps({"pid": os.getpid(), "pgid": os.getpgrp(), "warm": "torch" in sys.modules, "argv": sys.argv[1:],
                      "server": os.environ.get(warm_start.VARIABLE), "probe": os.environ.get("PROBE"),
                      "file": __file__}), flush=True)
    print("probe: to stderr", file=sys.stderr, flush=True)
    time.sleep(float(args.get("--sleep", 0)))
    sys.exit(int(args.get("--exit", 0)))
