# One simulation per (workload variant, deployment, system, seed): accelgen simulate.


rule deployment_config:
    localrule: True
    input:
        deployment_inputs,  # a profiled deployment's table (rules/profile.smk)
    output:
        f"{RESULTS}/deployments/{{deployment}}.yaml",
    params:
        spec=deployment_spec,
    log:
        f"{LOGS}/deployments/{{deployment}}.log",
    conda:
        "../environment.yml"
    shell:
        f"{PIPELINE} write-yaml --spec {{params.spec:q}} --out {{output}} > {{log}} 2>&1"


if PIPE.backend == "sim":

    rule simulate:
        input:
            trace=f"{DATA}/traces/{{variant}}/{{deployment}}/seed{{seed}}.parquet",
            experiment=f"{RESULTS}/deployments/{{deployment}}.yaml",
            floor=floor_inputs,  # an Oracle search: AccelGen's own run, its floor
        output:
            summary=f"{RUN_DIR}/summary.json",
            requests=f"{RUN_DIR}/requests.parquet",
            iterations=f"{RUN_DIR}/iterations.parquet",
        params:
            system=system_args,
        log:
            f"{LOGS}/runs/{{variant}}/{{deployment}}/{{system}}/seed{{seed}}.log",
        benchmark:
            f"{BENCH}/runs/{{variant}}/{{deployment}}/{{system}}/seed{{seed}}.tsv"
        threads: 1
        resources:
            mem_mb=sim_mem_mb,  # measured on full-size runs: accelgen/pipeline/resources.py
            runtime=sim_runtime,
        conda:
            "../environment.yml"
        shell:
            # params.system: `-m accelgen.cli simulate --policy P --param ...`, or the Oracle's
            # parameter search `-m accelgen.cli oracle --grid ...` (systems.<name>.search).
            f"{PY} {{params.system}} --trace {{input.trace}} --config {{input.experiment}}"
            " --seed {wildcards.seed} --out $(dirname {output.summary}) > {log} 2>&1"
