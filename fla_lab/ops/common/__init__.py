"""What every kernel family shares: `utils` (kernel registry, dtype policy, tiles), `launch` (validated launch
settings, the defaults per device), `chunk` (the stages both sides of a gated chunk pass run, and their launchers),
`fused_recurrent` (the step kernels of GLA, RWKV6 and both GSA passes, and their launchers), `value_flags` (the input
value checks)."""
