"""What every kernel family shares: `utils` (kernel registry, dtype policy, tiles), `launch` (validated launch
settings), `chunk` (the stages both sides of a gated chunk pass run, and their launchers), `value_flags` (the input
value checks)."""
