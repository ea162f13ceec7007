# The download stage: the dataset files that `workload.kind: datasets` traces read (Alpaca,
# ShareGPT, BookCorpus), fetched by `accelgen download` into the config's `download.dir`
# (default data/raw/), one job per file. Resumable, atomic, checksummed (SHA256SUMS in that
# directory; concurrent jobs update it under a file lock). Local rules: on SLURM they run on the
# submit host, which usually has the internet access compute nodes lack. docs/workloads.md.

DOWNLOADS = GRID.downloads()  # {file path: dataset name}; empty without `kind: datasets`
RAW = str(PIPE.download_config().dir)


if DOWNLOADS:

    rule download:
        localrule: True
        wildcard_constraints:
            dataset_file="|".join(re.escape(os.path.basename(p)) for p in DOWNLOADS),
        output:
            f"{RAW}/{{dataset_file}}",
        params:
            spec=download_spec,
            name=download_name,
        log:
            f"{LOGS}/download/{{dataset_file}}.log",
        resources:
            download=1,
        conda:
            "../environment.yml"
        shell:
            f"{ACCELGEN} download --spec {{params.spec:q}} --only {{params.name}}"
            " > {log} 2>&1 || {{ tail -n 4 {log} >&2; exit 1; }}"
