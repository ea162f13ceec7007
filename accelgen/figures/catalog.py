"""The figures the pipeline draws: for each, its Snakemake target, file id, notebook group, title
and the experiment whose runs it plots; the notebook groups in order; and the default directory
of the figures and their CSVs. The pipeline's grid builds its runs from this table, and the
plotting helpers name a missing figure's target from it."""

from __future__ import annotations

DEFAULT_FIGURES_DIR = "paper_figures"

# key, file id, notebook group, title, experiment
FIGURES: tuple[tuple[str, str, str, str, str], ...] = (
    ("fig01", "fig01_iteration_time_cdf", "measurement", "CDF of iteration time", "measurement"),
    ("fig02", "fig02_gpu_utilization", "measurement", "GPU compute utilization", "measurement"),
    ("fig03", "fig03_kvc_utilization", "measurement", "KVC utilization", "measurement"),
    ("fig04", "fig04_slo_attainment", "measurement", "Iteration-level SLO attainment",
     "measurement"),
    ("fig05", "fig05_system_slo", "measurement", "Sarathi-Serve with a system-wide SLO",
     "system_slo"),
    ("fig06", "fig06_era", "scenarios", "Exclusive Request Allocation vs Sarathi-Serve", "era"),
    ("fig07", "fig07_ordering", "measurement", "FIFO vs slack ordering in Sarathi-Serve",
     "ordering"),
    ("fig08", "fig08_workload_features", "workload", "Workload features", "features"),
    ("fig09", "fig09_evaluation", "evaluation", "Evaluation", "evaluation"),
    ("fig10", "fig10_ablation", "ablation", "Ablation", "ablation"),
    ("fig11", "fig11_sensitivity", "sensitivity", "Sensitivity", "sensitivity"),
    ("fig12", "fig12_datasets", "evaluation", "Goodput per dataset", "datasets"),
    ("extra_chunking", "extra_chunking", "scenarios",
     "Chunking illustration (paper figure 2)", "chunking"),
    ("extra_capacity", "extra_capacity", "sensitivity",
     "Capacity: SLO attainment vs arrival rate", "sensitivity"),
    ("extra_pivots", "extra_pivots", "workload", "Pivot forward sizes", "pivots"),
    ("extra_bounds", "extra_capacity_bounds", "evaluation",
     "Capacity bounds beside the offered rate", "evaluation"),
    ("fig13", "fig13_capacity", "capacity", "Capacity: SLO attainment vs arrival rate",
     "capacity"),
    ("fig14", "fig14_slo_scale", "capacity", "SLO attainment vs TTFT SLO scale", "capacity"),
    ("fig15", "fig15_latency", "capacity", "TTFT and TBT percentiles vs arrival rate",
     "capacity"),
    ("fig16", "fig16_classes", "capacity", "SLO attainment per SLO class vs arrival rate",
     "capacity"),
    ("fig18", "fig18_capacity_noise", "capacity",
     "Capacity against the engine's per-step noise", "capacity"),
)
GROUPS: tuple[str, ...] = ("measurement", "scenarios", "workload", "evaluation", "ablation",
                           "sensitivity", "capacity")
