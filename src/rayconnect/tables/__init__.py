"""Table formats the sink commits to: one committer per kind (Delta, Iceberg)."""
