"""kvgate: a multi-tenant prompt-caching LLM gateway with an embedded inference engine."""

from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parent.parent
