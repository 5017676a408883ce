"""The codemod behind `python -m host_callback.migrate` (see that module),
by job: `analysis`, `rewriting` (and `migrate_source`), `notebooks`, and
what they share in `common`. Needs libcst."""
