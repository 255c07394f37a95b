"""Event OS: AI employees run like processes on PostgreSQL and Temporal."""

__version__ = "0.1.0"
