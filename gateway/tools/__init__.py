"""Tools: how tool definitions, calls and results are rendered into the prompt, how the model's
calls are parsed back out, and how tool_choice is enforced (see docs/gateway.md, "Tools")."""
