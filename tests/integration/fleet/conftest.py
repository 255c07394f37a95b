"""The fleet tests' S3-compatible server (tests/s3_server.py), shared by the folder."""

from s3_server import s3_server  # noqa: F401
