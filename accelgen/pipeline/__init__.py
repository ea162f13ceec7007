"""The Snakemake pipeline's Python side.

- :mod:`accelgen.pipeline.config_file`: pydantic models of the pipeline sections of ``config/*.yaml``
  (validated when the Snakefile is parsed; ``config/schema.json`` is generated from them);
- :mod:`accelgen.pipeline.grid`: expansion of the experiment grid into trace, run and figure
  targets (the Snakefile and the aggregation jobs use the same functions);
- :mod:`accelgen.pipeline.scenarios`: the hand-built traces of paper figures 2 and 6;
- :mod:`accelgen.pipeline.aggregate`: results directories -> the CSV each figure plots;
- ``python -m accelgen.pipeline ...``: the small command line the rules call.
"""
