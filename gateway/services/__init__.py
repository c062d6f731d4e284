"""Keyword-only service functions over the database; routes and the CLI both call them."""
