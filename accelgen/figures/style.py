"""One palette for every figure: a system keeps its colour across all figures."""

from __future__ import annotations

# Keyed by the config's system names (config/*.yaml `systems:`); variants not listed fall back
# to their policy's base colour (see :func:`color`).
PALETTE: dict[str, str] = {
    "vllm": "#1f77b4",  # blue
    "vllm-v0": "#aec7e8",  # light blue
    "orca": "#8c564b",  # brown
    "fastgen": "#9467bd",  # purple
    "sarathi": "#2ca02c",  # green
    "sarathi-slack": "#98df8a",  # light green
    "sarathi-chunk512": "#2ca02c",
    "sarathi-nochunk": "#7f7f7f",  # grey
    "fastserve": "#ff7f0e",  # orange
    "edf": "#17becf",  # cyan
    "accelgen": "#d62728",  # red
    "accelgen-no-order": "#ff9896",  # light red
    "accelgen-no-chunk": "#e377c2",  # pink
    "accelgen-no-batch": "#7b1113",  # dark red
    "accelgen-budget-model": "#fdae6b",  # light orange
    "accelgen-no-era": "#f7b6d2",  # light pink
    "accelgen-era-request": "#a50f15",  # deep red
    # This artifact's extension (SPEC 13), not the paper's system: the closed loop.
    "accelgen-closed": "#e6550d",  # red-orange
    "oracle": "#222222",  # near black (clairvoyant)
    # Baselines as their users run them (SPEC 12): darker shades of their base's colour.
    "vllm-tuned": "#08306b",  # navy
    "vllm-priority": "#6a51a3",  # violet
    "vllm-priority-tuned": "#3f007d",  # deep violet
    "sarathi-tuned": "#00441b",  # dark green
    "sarathi-envelope": "#74c476",  # mid green (clairvoyant envelope)
    "fastgen-tuned": "#54278f",  # dark purple
    "edf-tuned": "#08585f",  # dark cyan
}
# Marker and line style per system, so that systems whose curves coincide (e.g. vLLM and
# Sarathi-Serve, AccelGen and AccelGen/Batch) stay distinguishable where their colours would not
# (figures 13-16). Systems not listed: a circle and a solid line.
MARKERS: dict[str, str] = {
    "vllm": "o", "vllm-v0": "o", "orca": "v", "fastgen": "P", "sarathi": "s",
    "sarathi-slack": "s", "fastserve": "D", "edf": "d", "accelgen": "*", "accelgen-no-order": "^",
    "accelgen-no-chunk": "v", "accelgen-no-batch": "x", "accelgen-budget-model": "<",
    "accelgen-no-era": ">", "accelgen-era-request": "h", "oracle": "p", "accelgen-closed": "P",
    "vllm-tuned": "o", "vllm-priority": "<", "vllm-priority-tuned": ">",
    "sarathi-tuned": "s", "sarathi-envelope": "X", "fastgen-tuned": "P", "edf-tuned": "d",
}
LINESTYLES: dict[str, str] = {
    "vllm": "-", "sarathi": "--", "orca": "-", "fastserve": "-", "fastgen": "-.",
    "edf": "-", "accelgen": "-", "accelgen-no-order": "--", "accelgen-no-chunk": "-.",
    "accelgen-no-batch": ":", "oracle": "--", "accelgen-closed": "--",
    "vllm-tuned": ":", "vllm-priority": "-.", "vllm-priority-tuned": ":",
    "sarathi-tuned": ":", "sarathi-envelope": "-", "fastgen-tuned": ":", "edf-tuned": ":",
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
    "orca", "vllm-v0", "vllm", "fastgen", "sarathi",
    "sarathi-slack", "sarathi-nochunk", "sarathi-chunk512", "fastserve", "edf",
    "accelgen-no-era", "accelgen", "accelgen-closed",
    "accelgen-era-request", "accelgen-no-order", "accelgen-no-chunk", "accelgen-no-batch",
    "accelgen-budget-model", "vllm-tuned", "vllm-priority", "vllm-priority-tuned",
    "sarathi-tuned", "sarathi-envelope", "fastgen-tuned", "edf-tuned", "oracle",
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


def _base(system: str, policy: str | None) -> str | None:
    """The palette key a system's style falls back to: its policy's (``accelgen/batch`` ->
    ``accelgen-no-batch``)."""
    if policy is None:
        return None
    return POLICY_BASE.get(policy, policy)


def marker(system: str, policy: str | None = None) -> str:
    """The marker of a system (by config name, then by its policy; default a circle)."""
    return MARKERS.get(system) or MARKERS.get(_base(system, policy) or "", "o")


def linestyle(system: str, policy: str | None = None) -> str:
    """The line style of a system (by config name, then by its policy; default solid)."""
    return LINESTYLES.get(system) or LINESTYLES.get(_base(system, policy) or "", "-")


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
