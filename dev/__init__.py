"""Tools for the repository itself (tests, notebooks, docs), not for users of the package: `python -m dev.<tool>`."""
