# Workload variants -> trace files (accelgen trace), and the hand-built scenario traces.


rule workload_config:
    localrule: True
    output:
        f"{DATA}/workloads/{{variant}}.yaml",
    params:
        spec=workload_spec,
    log:
        f"{LOGS}/workloads/{{variant}}.log",
    conda:
        "../environment.yml"
    shell:
        f"{PIPELINE} write-yaml --spec {{params.spec:q}} --out {{output}} > {{log}} 2>&1"


rule scenario:
    localrule: True
    output:
        f"{DATA}/scenarios/{{scenario}}.csv",
    params:
        spec=scenario_spec,
    log:
        f"{LOGS}/scenarios/{{scenario}}.log",
    conda:
        "../environment.yml"
    shell:
        f"{PIPELINE} scenario --spec {{params.spec:q}} --out {{output}} > {{log}} 2>&1"


rule trace:
    # Seconds for the synthetic workloads (a 20K-request trace: ~1 s), so they stay on a cluster's
    # submit host; tokenizing downloaded datasets (kind: datasets) is a job of its own.
    localrule: not GRID.downloads()
    input:
        unpack(trace_inputs),
    output:
        f"{DATA}/traces/{{variant}}/{{deployment}}/seed{{seed}}.parquet",
    params:
        args=trace_args,
    log:
        f"{LOGS}/traces/{{variant}}/{{deployment}}/seed{{seed}}.log",
    conda:
        "../environment.yml"
    shell:
        f"{ACCELGEN} trace --config {{input.workload}} --out {{output}} --seed {{wildcards.seed}}"
        " {params.args} > {log} 2>&1"
