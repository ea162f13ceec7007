# The profile stage (`profile:` of a deployment): `accelgen profile` measures the deployment's
# iteration latencies on its own hardware - `--backend vllm` steps its real engine (`engine:`:
# the model's weights on tp x pp GPUs, or the tiny CPU model), `--backend torch` a random decoder
# of its shape with flash-attn's varlen kernels on one GPU - and writes the table that becomes
# its cost model (`cost_model: profile`): TTFT SLOs of its traces, the policies' predictions in
# simulations and in the replays' plugin, and its pivot S_pf. docs/profiling.md.


if GRID.profiled():

    rule profile:
        wildcard_constraints:
            deployment="|".join(re.escape(d) for d in GRID.profiled()),
        output:
            csv=f"{RESULTS}/profiles/{{deployment}}.csv",
            png=f"{RESULTS}/profiles/{{deployment}}.png",
            pdf=f"{RESULTS}/profiles/{{deployment}}.pdf",
        params:
            args=profile_args,
        log:
            f"{LOGS}/profiles/{{deployment}}.log",
        benchmark:
            f"{BENCH}/profiles/{{deployment}}.tsv"
        threads: 2
        resources:
            engine=1,
            gpu=deployment_gpus,
            mem_mb=16000,
            runtime=180,
        conda:
            "../environment.yml"
        shell:
            f"{ACCELGEN} profile {{params.args}} --out {{output.csv}} --plot {{output.png}}"
            " > {log} 2>&1 || {{ tail -n 8 {log} >&2; exit 1; }}"
