"""The tenant-facing self-serve billing API goes here (the dashboard issue fills it).

Its routes will be mounted for tenant API keys rather than the admin token, scoped to the
caller's own tenant, and call the same `billing.operations` and `billing.schemas` as the admin API.
"""
