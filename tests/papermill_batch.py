"""Several notebooks executed by papermill one after the other in one process
(``tests/test_notebooks.py``):

    python tests/papermill_batch.py < jobs.json > results.json    # in the notebooks' working dir

Each job (``{"input", "output", "parameters"}``) is what ``papermill -k python3 INPUT OUTPUT -p
NAME VALUE ...`` runs: ``papermill.execute_notebook`` with a kernel of its own, started in this
process's working directory. What a batch saves is the interpreter and papermill's imports per
notebook (about a second each); every notebook still gets a fresh kernel. The result: for each job,
``{"error": null or the error's last lines}``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from typing import Any

# A kernel that dies before it answers (jupyter_client picks its five ports by binding and
# releasing them, and a kernel started at the same moment by the batch beside this one can take
# one in between) never ran the notebook: it is started again, at most this many times more.
KERNEL_START_RETRIES = 2
_KERNEL_DIED = "Kernel died before replying to kernel_info"


def run(jobs: list[dict[str, Any]]) -> list[dict[str, str | None]]:
    import papermill

    results: list[dict[str, str | None]] = []
    for job in jobs:
        for attempt in range(KERNEL_START_RETRIES + 1):
            try:
                papermill.execute_notebook(job["input"], job["output"],
                                           parameters=job.get("parameters") or {},
                                           kernel_name="python3", progress_bar=False)
            except RuntimeError as e:
                if _KERNEL_DIED in str(e) and attempt < KERNEL_START_RETRIES:
                    print(f"{job['input']}: {e}; starting its kernel again", file=sys.stderr)
                    continue
                results.append({"error": traceback.format_exc()[-6000:]})
            except Exception:  # the notebook's failure is the result to report
                results.append({"error": traceback.format_exc()[-6000:]})
            else:
                results.append({"error": None})
            break
    return results


if __name__ == "__main__":
    jobs = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # (stdout carries the results alone)
        results = run(jobs)
    json.dump(results, sys.stdout)
