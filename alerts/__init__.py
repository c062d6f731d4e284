"""Alerts that reach people (issue 27): budget 80%/100%, refusals, cache hit-rate drops and spend anomalies,
evaluated in the background from billing's counters and rollups and the usage records, stored once per
(tenant, kind, period), and delivered by email and by signed webhooks with retries.

Layer: above kvgate core and billing, below the dashboard (web/ reads and edits these tables) and the
composition root (kvgate/app.py wires the evaluator into `kvgate serve` and hands it web's mailer).
"""
