"""Tasksets: the jsonl/Parquet reader with located errors, and the Ray Data datasource over it."""
