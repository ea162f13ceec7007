# Per-figure aggregation (results -> <figures_dir>/<figure>.csv), one papermill notebook per
# figure group (CSVs -> <figure>.png/.pdf; the executed notebook is kept as the log), and one
# target rule per figure (fig01 ... fig15, extra_*, claims; see docs/ARTIFACT.md).

import re

# The figure ids `aggregate` makes: it must not claim another stage's CSV in the figures
# directory (rules/fidelity.smk writes fidelity.csv).
AGGREGATE_FIGURES = "|".join(re.escape(f) for f in GRID.csv_figure_ids())


rule aggregate:
    localrule: True
    wildcard_constraints:
        figure=AGGREGATE_FIGURES,
    input:
        figure_inputs,
    output:
        f"{FIGS}/{{figure}}.csv",
    params:
        spec=figure_spec,
    log:
        f"{LOGS}/aggregate/{{figure}}.log",
    benchmark:
        f"{BENCH}/aggregate/{{figure}}.tsv"
    conda:
        "../environment.yml"
    shell:
        # The spec goes through stdin (printf is a shell builtin): as an argument it would pass
        # Linux's 128 KiB limit on one argument (figure 13 of the paper config is ~1.3 MB).
        f"printf '%s' {{params.spec:q}} | {PIPELINE} aggregate --spec @- --out {{output}}"
        " > {log} 2>&1"


for _group in GRID.groups():

    rule:
        name:
            f"notebook_{_group}"
        localrule: True
        # (a notebook's kernel can die before it answers when another job starts one at the same
        # moment: jupyter_client picks its ports by binding and releasing them; the notebook then
        # never ran, and running the job again starts a new kernel)
        retries: 2
        input:
            notebook=notebook_input(_group),
            csv=[GRID.figure_file(f.id, "csv") for f in GRID.group_figures(_group)],
        output:
            [path for f in GRID.group_figures(_group) for path in GRID.figure_outputs(f)],
        params:
            figures=",".join(f.id for f in GRID.group_figures(_group)),
            figures_dir=output_dir,
            code=notebook_code(_group),
        log:
            notebook=f"{LOGS}/notebooks/{_group}.ipynb",
            stderr=f"{LOGS}/notebooks/{_group}.log",
        benchmark:
            f"{BENCH}/notebooks/{_group}.tsv"
        conda:
            "../environment.yml"
        shell:
            f"{PY} -m papermill -k python3 --no-progress-bar {{input.notebook}} {{log.notebook}}"
            " -p figures_dir {params.figures_dir:q} -p figures {params.figures:q}"
            " > {log.stderr} 2>&1"


for _fig in GRID.figures.values():

    rule:
        name:
            _fig.key
        localrule: True
        input:
            [GRID.figure_file(_fig.id, "csv"), *GRID.figure_outputs(_fig)],


rule results:
    localrule: True
    input:
        GRID.traces(),
        GRID.run_summaries(),


# The paper's claims beside ours in both regimes, with verdicts (SPEC 11; docs/ARTIFACT.md).
rule claims:
    localrule: True
    input:
        GRID.figure_file("claims", "csv"),


# The former headline table's target, now the claims table.
rule headline:
    localrule: True
    input:
        GRID.figure_file("claims", "csv"),
