"""k3trace: critical-path and two-stream analysis of LLM decode steps from Nsight Systems traces."""

__version__ = "0.1.0"
