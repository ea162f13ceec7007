"""AccelGen: SLO-guaranteed LLM serving scheduler, baselines, simulator and vLLM plugin."""

__version__ = "0.1.0"
