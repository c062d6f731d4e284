"""The engine server: the embedded engine alone, behind vLLM's OpenAI-compatible HTTP protocol."""

from inference.server.app import create_app

__all__ = ["create_app"]
