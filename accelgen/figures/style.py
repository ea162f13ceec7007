"""One palette for every figure: a system keeps its colour across all figures."""

from __future__ import annotations

# Keyed by the config's system names (config/*.yaml `systems:`); variants not listed fall back
# to their policy's base colour (see :func:`color`).
PALETTE: dict[str, str] = {
    "vllm": "#1f77b4",  # blue
    "vllm-v0": "#aec7e8",  # light blue
    "vllm-tuned": "#08306b",  # navy (regime engine: stock vLLM at the tuned budget)
    "orca": "#8c564b",  # brown
    "fastgen": "#9467bd",  # purple
    "sarathi": "#2ca02c",  # green
    "sarathi-slack": "#98df8a",  # light green
    "sarathi-chunk512": "#2ca02c",
    "sarathi-nochunk": "#7f7f7f",  # grey
    "fastserve": "#ff7f0e",  # orange
    "edf": "#17becf",  # cyan
    "sarathi-tuned": "#006d2c",  # dark green (regime engine, hosted by the plugin)
    "edf-tuned": "#0e7c86",  # dark cyan (regime engine, hosted by the plugin)
    "accelgen": "#d62728",  # red
    "accelgen-no-order": "#ff9896",  # light red
    "accelgen-no-chunk": "#e377c2",  # pink
    "accelgen-no-batch": "#7b1113",  # dark red
    "accelgen-budget-model": "#fdae6b",  # light orange
    "accelgen-no-era": "#f7b6d2",  # light pink
    "accelgen-era-request": "#a50f15",  # deep red
    "oracle": "#222222",  # near black (clairvoyant)
}
# Policy (registry name) -> palette key, for systems not in PALETTE.
POLICY_BASE: dict[str, str] = {
    "accelgen/order": "accelgen-no-order",
    "accelgen/chunk": "accelgen-no-chunk",
    "accelgen/batch": "accelgen-no-batch",
}
FALLBACK = "#bcbd22"

# Preferred left-to-right order of systems in bar charts: baselines, then AccelGen, then Oracle.
ORDER: tuple[str, ...] = (
    "orca", "vllm-v0", "vllm", "vllm-tuned", "fastgen", "sarathi", "sarathi-tuned",
    "sarathi-slack", "sarathi-nochunk", "sarathi-chunk512", "fastserve", "edf", "edf-tuned",
    "accelgen-no-era", "accelgen",
    "accelgen-era-request", "accelgen-no-order", "accelgen-no-chunk", "accelgen-no-batch",
    "accelgen-budget-model", "oracle",
)


def color(system: str, policy: str | None = None) -> str:
    """The colour of a system (by config name, then by its policy, then a fallback)."""
    if system in PALETTE:
        return PALETTE[system]
    if policy is not None:
        if policy in PALETTE:
            return PALETTE[policy]
        if policy in POLICY_BASE:
            return PALETTE[POLICY_BASE[policy]]
        base = policy.split("/")[0].split("-")[0]
        if base in PALETTE:
            return PALETTE[base]
    return FALLBACK


def system_order(systems: list[str]) -> list[str]:
    """``systems`` (unique, in input order for unknown ones) sorted by :data:`ORDER`."""
    uniq = list(dict.fromkeys(systems))
    rank = {s: i for i, s in enumerate(ORDER)}
    return sorted(uniq, key=lambda s: (rank.get(s, len(ORDER)), uniq.index(s)))

# Datasets (figures 8 and 12) and deployments (pivot curves) get their own small palettes.
DATASET_COLORS: dict[str, str] = {
    "all": "#222222",
    "alpaca": "#66c2a5",
    "sharegpt": "#fc8d62",
    "bookcorpus": "#8da0cb",
}
DEPLOYMENT_COLORS: tuple[str, ...] = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3",
                                      "#937860", "#da8bc3", "#8c8c8c")
