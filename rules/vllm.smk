# The real-engine backend (`backend: vllm` in the config): the same runs, replayed through
# vLLM with the policy as its scheduler (accelgen replay, accelgen/vllm_integration/). Engines
# run one at a time: each job takes `engine=1` and profiles/default/config.yaml sets the global
# limit to 1. Off by default; the replay command's options belong to the vLLM integration.

if PIPE.backend == "vllm":

    rule replay:
        input:
            trace=f"{DATA}/traces/{{variant}}/{{deployment}}/seed{{seed}}.parquet",
            experiment=f"{RESULTS}/deployments/{{deployment}}.yaml",
        output:
            summary=f"{RUN_DIR}/summary.json",
            requests=f"{RUN_DIR}/requests.parquet",
            iterations=f"{RUN_DIR}/iterations.parquet",
        params:
            system=replay_args,
            engine=replay_engine,  # the deployment's `engine:` (real weights, TP)
            extra=PIPE.vllm.extra_args,
        log:
            f"{LOGS}/runs/{{variant}}/{{deployment}}/{{system}}/seed{{seed}}.log",
        benchmark:
            f"{BENCH}/runs/{{variant}}/{{deployment}}/{{system}}/seed{{seed}}.tsv"
        threads: 2
        resources:
            engine=1,
            gpu=deployment_gpus,
            mem_mb=8000,
            runtime=240,
        conda:
            "../environment.yml"
        shell:
            f"{ACCELGEN} replay --backend vllm --trace {{input.trace}}"
            " --config {input.experiment} {params.system} --seed {wildcards.seed}"
            " --out $(dirname {output.summary}) --no-progress {params.engine} {params.extra}"
            " > {log} 2>&1"
