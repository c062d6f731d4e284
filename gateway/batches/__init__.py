"""Batches: Anthropic Message Batches and OpenAI Batch (with its Files), stored in the database and run
by a low-priority runner through the interactive generation path (docs/gateway.md, "Batches")."""
