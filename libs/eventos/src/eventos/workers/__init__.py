"""The Temporal workers of the workflow and egress services (SPEC §7): which workflows and
activities each role registers (`roles`), and the database-bound activities (`activities`)."""
