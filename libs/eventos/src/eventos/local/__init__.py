"""A local instance on one machine (SPEC §14, §17 "Local instance"): `python -m eventos.local`
(`make run`) runs the embedded PostgreSQL, the Temporal dev server or the tier L server, the
migrations and the six services as child processes, and applies the example employees."""
