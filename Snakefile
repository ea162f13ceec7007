# AccelGen artifact pipeline: traces -> simulations -> per-figure CSVs -> papermill notebooks ->
# paper_figures/. Default target: every figure of SPEC section 8 on the quick config.
#
#   snakemake --cores all                                   # quick config (minutes)
#   snakemake --cores all --configfile config/paper.yaml    # the paper's full setup
#   snakemake --cores all fig09                             # one figure (targets: docs/ARTIFACT.md)
#
# The config is validated when this file is parsed (accelgen.pipeline.config_file, then
# config/schema.json); a bad value stops everything before any job runs.

from snakemake.utils import min_version

min_version("8.10")


configfile: "config/quick.yaml"


include: "rules/common.smk"
include: "rules/download.smk"
include: "rules/workloads.smk"
include: "rules/profile.smk"
include: "rules/simulate.smk"
include: "rules/vllm.smk"
include: "rules/fidelity.smk"
include: "rules/engine.smk"
include: "rules/figures.smk"


# Every figure (CSV, PNG, PDF) plus every trace and simulation result: results are targets too,
# so deleting one re-creates it and re-runs exactly what depends on it.
rule all:
    default_target: True
    localrule: True
    input:
        GRID.all_targets(),
        rules.results.input,
        FIDELITY_TARGETS,
        ENGINE_TARGETS,
