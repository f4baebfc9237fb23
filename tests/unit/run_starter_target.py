"""A stand-in for ``prefect.engine`` that ``tests/unit/test_run_starter.py`` runs through the run
starter: it prints what it is (one JSON line), then sleeps and exits as ``PREFECT__TEST_*``
variables say (per-run variables, the only ones a run's environment may change)."""

from __future__ import annotations

import json
import os
import random
import sys
import time

import numpy as np

from dprelease.mechanisms.primitives.noise import production_sampler


def main() -> None:
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "leader": os.getsid(0) == os.getpid() == os.getpgid(0),
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "run": os.environ.get("PREFECT__FLOW_RUN_ID"),
        "argv": sys.argv,
        "noise": production_sampler().add_laplace(np.zeros(4), scale=1.0).tolist(),
        "numpy_global": float(np.random.random()),
        "random": random.random(),
    }
    print(json.dumps(report), flush=True)
    sys.stderr.write("a line on stderr\n")
    time.sleep(float(os.environ.get("PREFECT__TEST_SLEEP", "0")))
    sys.exit(int(os.environ.get("PREFECT__TEST_EXIT", "0")))


if __name__ == "__main__":  # imported by the starter's preload, run as __main__ per run
    main()
